"""Non-blocking ZMQ I/O on an asyncio loop without a future per message.

A :class:`Reader` watches a plain (not ``zmq.asyncio``) socket's file descriptor and, when
woken, drains every message that is ready in one go (batched receive), handing each to a
callback. Sends are non-blocking and immediate. This avoids the per-message futures, tasks
and flag enums of ``zmq.asyncio``, which dominated the broker's and client's CPU.

ZMQ signals its descriptor on edges, and any send may consume an edge; so after each send
the socket's ``EVENTS`` is checked and a drain scheduled when input is waiting.
"""

from __future__ import annotations

import asyncio
import errno
import logging
from collections.abc import Callable
from typing import Any, cast

import zmq

__all__ = ["MAX_BATCH", "Reader", "send_frames", "send_retry"]

log = logging.getLogger("tracewire.serve")

#: Messages handled per wake-up before yielding to other callbacks (fairness).
MAX_BATCH = 256
# Plain ints: pyzmq's flag enums cost more than the calls they configure.
_NOBLOCK = int(zmq.NOBLOCK)
_MORE = int(zmq.NOBLOCK | zmq.SNDMORE)
_EVENTS = int(zmq.EVENTS)
_RCVMORE = int(zmq.RCVMORE)
_POLLIN = int(zmq.POLLIN)


class Reader:
    """Calls ``on_message(frames)`` for every message arriving on ``sock`` (frames uncopied)."""

    def __init__(self, sock: zmq.Socket[Any], on_message: Callable[[list[zmq.Frame]], None],
                 name: str = "socket") -> None:
        self.sock = sock
        self.on_message = on_message
        self.name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._fd: int | None = None
        self._scheduled = False
        self.closed = False

    def start(self) -> None:
        """Begin watching the socket (on the running loop)."""
        self._loop = asyncio.get_running_loop()
        fd = self._fd = int(self.sock.getsockopt(zmq.FD))
        self._loop.add_reader(fd, self._drain)
        self._schedule()  # messages may have arrived before the watch began

    def stop(self) -> None:
        """Stop watching (call before closing the socket)."""
        self.closed = True
        if self._loop is not None and self._fd is not None:
            self._loop.remove_reader(self._fd)

    def _schedule(self) -> None:
        if not self._scheduled and not self.closed and self._loop is not None:
            self._scheduled = True
            self._loop.call_soon(self._drain)

    def _drain(self) -> None:
        self._scheduled = False
        sock, on_message = self.sock, self.on_message
        recv = sock.recv
        get = cast("Callable[[int], int]", sock.get)  # EVENTS and RCVMORE are ints
        for _ in range(MAX_BATCH):
            if self.closed:
                return
            try:
                # Reading EVENTS re-arms the descriptor; cheaper than ending on zmq.Again.
                if not get(_EVENTS) & _POLLIN:
                    return
                frames = [recv(_NOBLOCK, copy=False)]
                while get(_RCVMORE):
                    frames.append(recv(_NOBLOCK, copy=False))
            except zmq.Again:
                return
            except zmq.ZMQError as exc:
                if exc.errno not in (zmq.ETERM, zmq.ENOTSOCK, errno.EBADF):
                    log.warning("receive on %s failed: %s", self.name, exc)
                return
            try:
                on_message(frames)
            except Exception:
                log.exception("handling a message from %s failed", self.name)
        self._schedule()  # more may be waiting: continue after other callbacks ran

    def send(self, frames: list[Any]) -> None:
        """Send at once; raises ``zmq.ZMQError`` (``zmq.Again`` when the peer's queue is full)."""
        send_frames(self.sock, frames)
        # The send may have consumed the edge that announced input: look for it.
        if cast("int", self.sock.get(_EVENTS)) & _POLLIN:
            self._schedule()


def send_frames(sock: zmq.Socket[Any], frames: list[Any]) -> None:
    """Send one multipart message without waiting and without copying the frames.

    Raises ``zmq.Again`` when the peer's queue is full: only the first part can meet a full
    queue; the rest follow atomically.
    """
    send = sock.send
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        send(frame, _MORE if i < last else _NOBLOCK, copy=False)


async def send_retry(send: Callable[[list[Any]], None], frames: list[Any], *,
                     poll_s: float = 0.001) -> None:
    """Call ``send(frames)``, waiting (without blocking the loop) while it raises
    ``zmq.Again`` (the peer's queue is full)."""
    while True:
        try:
            send(frames)
            return
        except zmq.Again:
            await asyncio.sleep(poll_s)
