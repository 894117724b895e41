"""The broker's transport: its two ROUTER sockets, their CURVE guard, monitors and readers.

Clients talk to the front socket; workers connect (DEALER) to the back one, on an endpoint
chosen for the pool (inproc:// for in-process workers, an ipc:// socket in a private
directory on the same host, loopback TCP otherwise). Sockets bound on TCP are CURVE servers
(``_auth``, armed by :class:`~._guard.Guard`).
"""

from __future__ import annotations

import shutil
import struct
import tempfile
from collections.abc import Callable
from typing import Any

import zmq

from .._errors import ServeError
from ._auth import is_tcp
from ._config import ServerConfig
from ._guard import Guard
from ._io import Reader
from ._pool import WorkerPool

__all__ = ["HANDSHAKE_FAILED", "BrokerSockets", "monitor_event"]

Frames = list[Any]
# What a socket monitor reports, and the events counted as a refused handshake.
_EVENT = struct.Struct("=HI")
HANDSHAKE_FAILED = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                    | zmq.EVENT_HANDSHAKE_FAILED_AUTH)


def monitor_event(frames: Frames) -> int:
    """The event number of one socket-monitor message."""
    event, _ = _EVENT.unpack_from(frames[0].buffer)
    return int(event)


class BrokerSockets:
    """Binds, watches and closes the broker's sockets; sends go through ``front_io`` /
    ``back_io`` (plain sockets drained in one batch per wake-up, see ``_io``)."""

    def __init__(self) -> None:
        self.ctx: zmq.Context[Any] = zmq.Context()
        self.guard = Guard(self.ctx)
        self.front: zmq.Socket[Any] | None = None
        self.back: zmq.Socket[Any] | None = None
        self.address = ""
        self.worker_endpoint = ""
        self.curve_front = False
        self._readers: list[Reader] = []
        self._monitors: list[tuple[zmq.Socket[Any], zmq.Socket[Any]]] = []
        self._tmpdir: str | None = None

    def bind(self, cfg: ServerConfig, address: str, pool: WorkerPool, tag: str) -> None:
        """Bind the client socket on ``address`` and the worker socket on the endpoint the
        pool needs (in-process pools are attached to it); ``ServeError`` if either fails."""
        endpoint = cfg.worker_endpoint
        if pool.in_process:
            # In-process workers use inproc:// alone; nothing else may dial in.
            endpoint = f"inproc://tracewire-workers-{tag}"
        elif endpoint is None and pool.same_host:
            self._tmpdir = tempfile.mkdtemp(prefix="tw-serve-")
            endpoint = f"ipc://{self._tmpdir}/workers.sock"
        elif endpoint is None:
            endpoint = "tcp://127.0.0.1:0"  # remote workers: loopback unless told otherwise
        curve_front = self.curve_front = cfg.curve and is_tcp(address)
        curve_workers = cfg.curve and is_tcp(endpoint)
        front = self.front = self.ctx.socket(zmq.ROUTER)
        front.setsockopt(zmq.LINGER, 1000)
        front.setsockopt(zmq.MAXMSGSIZE, cfg.max_request_bytes)
        # Sends to a gone or non-reading peer fail loudly instead of vanishing.
        front.setsockopt(zmq.ROUTER_MANDATORY, 1)
        if curve_front:
            self.guard.arm(front, workers=False)
        try:
            front.bind(address)
        except zmq.ZMQError as exc:
            front.close(0)
            self.guard.close()
            raise ServeError(f"cannot bind {address}: {exc}") from exc
        self.address = str(front.getsockopt_string(zmq.LAST_ENDPOINT))
        back = self.back = self.ctx.socket(zmq.ROUTER)
        back.setsockopt(zmq.LINGER, 0)
        back.setsockopt(zmq.ROUTER_MANDATORY, 1)
        if curve_workers:
            self.guard.arm(back, workers=True)
        try:
            back.bind(endpoint)
        except zmq.ZMQError as exc:
            front.close(0)
            back.close(0)
            self.guard.close()
            raise ServeError(f"cannot bind the worker endpoint {endpoint}: {exc}") from exc
        self.worker_endpoint = str(back.getsockopt_string(zmq.LAST_ENDPOINT))
        if pool.in_process:
            pool.attach(self.ctx, self.worker_endpoint)
        if curve_front:
            self.guard.admit_clients(self.address, cfg.client_key_file, cfg.client_keys)

    def serve(self, on_client: Callable[[Frames], None], on_worker: Callable[[Frames], None],
              on_event: Callable[[str, Frames], None]) -> None:
        """Start reading both sockets (and the monitors ``on_event(who, frames)`` hears)."""
        assert self.front is not None and self.back is not None
        self.front_io = Reader(self.front, on_client, "clients")
        self.back_io = Reader(self.back, on_worker, "workers")
        self._readers = [self.front_io, self.back_io]
        # A worker's connection closing (its process or node gone) is heard at once; the
        # heartbeat timeout stays the backstop for peers that vanish without closing.
        self._watch(self.back, zmq.EVENT_DISCONNECTED | HANDSHAKE_FAILED, "worker", on_event)
        if self.curve_front:
            self._watch(self.front, HANDSHAKE_FAILED, "client", on_event)
        for r in self._readers:
            r.start()

    def _watch(self, sock: zmq.Socket[Any], events: int, who: str,
               on_event: Callable[[str, Frames], None]) -> None:
        monitor = sock.get_monitor_socket(events)
        self._monitors.append((sock, monitor))
        self._readers.append(Reader(monitor, lambda frames: on_event(who, frames),
                                    f"{who}-monitor"))

    def close(self) -> None:
        """Stop reading, close every socket and the context, remove the ipc directory."""
        for r in self._readers:
            r.stop()
        for sock, monitor in self._monitors:
            sock.disable_monitor()
            monitor.close(linger=0)
        for s in (self.front, self.back):
            if s is not None:
                s.close(linger=1000)
        self.guard.close()
        self.ctx.term()
        if self._tmpdir:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
