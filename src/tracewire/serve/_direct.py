"""The direct data path: episode frames from a worker straight to the client, past the broker.

Through the broker, every token byte crosses two sockets (worker -> broker -> client): four
kernel copies and a broker wake-up per message. When client and server share a host, the
client binds one PULL socket on loopback and names it in each run request (``data``); the
worker then PUSHes that run's deltas and final reply to it, and tells the broker only that
the job is done (:attr:`~tracewire.serve._protocol.JobKind.DONE`, no payload). Errors,
cancellation, timeouts and worker deaths still travel through the broker, which stays the
only place that decides a job's fate; whichever final answer reaches the client first wins.

Only loopback TCP and ``ipc://`` addresses are accepted, so a client cannot make workers
connect elsewhere. A loopback server address does not prove a shared loopback (an SSH tunnel
or another container forwards ``127.0.0.1`` to a different machine or network namespace),
so the client turns the direct path on for a server only when the server's ``hello`` answer
names the same kernel boot and network namespace as the client's own (:func:`loopback_id`).
"""

from __future__ import annotations

import os
import re
from collections import OrderedDict
from typing import Any

import zmq

from ._io import send_frames

__all__ = [
    "MAX_DIRECT_SOCKETS",
    "DirectSenders",
    "is_local_endpoint",
    "loopback_id",
    "valid_data_address",
]

#: PUSH sockets a worker keeps open (one per client address); the least recently used goes.
MAX_DIRECT_SOCKETS = 32
#: Messages queued per client before sends fail with ``zmq.Again`` (the streamer retries).
SEND_HWM = 64
_LOOPBACK_TCP = re.compile(r"tcp://(127\.0\.0\.1|localhost|\[::1\]):\d{1,5}")


def valid_data_address(address: object) -> bool:
    """True for an address the broker lets workers send to (loopback TCP or ``ipc://``)."""
    return isinstance(address, str) and len(address) < 512 and (
        _LOOPBACK_TCP.fullmatch(address) is not None or address.startswith("ipc://"))


def is_local_endpoint(address: str) -> bool:
    """True when a server at ``address`` runs on this host (so workers can reach loopback)."""
    return valid_data_address(address) or address.startswith("inproc://")


def loopback_id() -> str | None:
    """Who owns this process's loopback interface: kernel boot id and network namespace.

    Two processes with the same id reach each other on ``127.0.0.1``. None where it cannot
    be told (no ``/proc``): the direct path then stays off.
    """
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        netns = os.stat("/proc/self/ns/net").st_ino
    except OSError:
        return None
    return f"{boot}:{netns}"


class DirectSenders:
    """A worker's PUSH sockets to client data addresses, created on first use."""

    def __init__(self, ctx: zmq.Context[Any]) -> None:
        self._ctx = ctx
        self._socks: OrderedDict[str, zmq.Socket[Any]] = OrderedDict()

    def send(self, address: str, frames: list[Any]) -> None:
        """Send one message without waiting; raises ``zmq.Again`` while the queue is full."""
        sock = self._socks.get(address)
        if sock is None:
            sock = self._ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.SNDHWM, SEND_HWM)
            # Let a closing worker deliver what it queued, but not forever.
            sock.setsockopt(zmq.LINGER, 1000)
            sock.connect(address)
            self._socks[address] = sock
            while len(self._socks) > MAX_DIRECT_SOCKETS:
                _, old = self._socks.popitem(last=False)
                old.close()
        else:
            self._socks.move_to_end(address)
        send_frames(sock, frames)

    def close(self) -> None:
        """Close every socket (queued messages get the linger time to leave)."""
        for sock in self._socks.values():
            sock.close()
        self._socks.clear()
