"""The direct data path: episode frames from a worker straight to the client, past the broker.

Through the broker, every token byte crosses two sockets (worker -> broker -> client): four
kernel copies and a broker wake-up per message. When client and server share a host, the
client binds one PULL socket on loopback and names it in each run request (``data``); the
worker then PUSHes that run's deltas and final reply to it, and tells the broker only that
the job is done (:attr:`~tracewire.serve._protocol.JobKind.DONE`, no payload). Errors,
cancellation, timeouts and worker deaths still travel through the broker, which stays the
only place that decides a job's fate; whichever final answer reaches the client first wins.

Only loopback TCP and ``ipc://`` addresses are accepted, so a client cannot make workers
connect elsewhere.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from typing import Any

import zmq

__all__ = ["MAX_DIRECT_SOCKETS", "DirectSenders", "is_local_endpoint", "valid_data_address"]

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
        last = len(frames) - 1
        for i, frame in enumerate(frames):
            # Only the first part can meet a full queue; the rest follow atomically.
            sock.send(frame, zmq.NOBLOCK | (zmq.SNDMORE if i < last else 0), copy=False)

    def close(self) -> None:
        """Close every socket (queued messages get the linger time to leave)."""
        for sock in self._socks.values():
            sock.close()
        self._socks.clear()
