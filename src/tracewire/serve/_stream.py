"""Streams one episode from a worker as deltas while its runner fills it.

Watchers on the episode's traces arm a timer on the first ``notify()`` after a send; when
it fires (``coalesce_s`` later, so a burst of turns becomes one delta) everything new goes
out as one delta. A slow poll timer also catches new traces and phase changes that nobody
notified. No task per episode and no wake-up per turn: a turn costs a flag check. Each
flush costs O(new data) (see :class:`tracewire.codec.EpisodeSender`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import zmq

from ..codec import EpisodeDelta, EpisodeSender, encode_frames
from ..trace import Episode, Trace

__all__ = ["EpisodeStreamer", "SendDelta"]

log = logging.getLogger("tracewire.serve")

#: Sends one delta's frames at once; raises ``zmq.Again`` when the socket cannot take them.
SendDelta = Callable[[EpisodeDelta, list[Any]], None]


class EpisodeStreamer:
    """Watches ``episode`` and sends its deltas through ``send`` until :meth:`finish`."""

    def __init__(self, episode: Episode, send: SendDelta, *, stream: bool = True,
                 coalesce_s: float = 0.002, poll_s: float = 0.05,
                 retry_s: float = 0.001) -> None:
        self.episode = episode
        self.sender = EpisodeSender(episode)
        self.deltas = 0
        self._send = send
        self._stream = stream
        self._coalesce_s = coalesce_s
        self._poll_s = poll_s
        self._retry_s = retry_s
        self._watched: dict[str, tuple[Trace, Callable[[], None]]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._flush_at: asyncio.TimerHandle | None = None
        self._poll: asyncio.TimerHandle | None = None
        self._done = False

    def start(self) -> None:
        """Start watching (a no-op when not streaming)."""
        if self._stream:
            self._loop = asyncio.get_running_loop()
            self._watch_new()
            # The runner usually creates its trace after this: watch it at its first yield.
            self._loop.call_soon(self._watch_new)
            self._poll = self._loop.call_later(self._poll_s, self._on_poll)

    def _on_notify(self, _trace: Trace) -> None:
        if self._flush_at is None and not self._done:
            assert self._loop is not None
            self._flush_at = self._loop.call_later(self._coalesce_s, self._on_timer)

    def _watch_new(self) -> None:
        for t in self.episode.traces:
            have = self._watched.get(t.id)
            if have is None or have[0] is not t:
                self._watched[t.id] = (t, t.watch(self._on_notify))

    def _on_timer(self) -> None:
        self._flush_at = None
        self._tick()

    def _on_poll(self) -> None:
        assert self._loop is not None
        self._poll = self._loop.call_later(self._poll_s, self._on_poll)
        self._tick()

    def _tick(self) -> None:
        if self._done:
            return
        self._watch_new()
        try:
            if self.flush_now() is False:
                # The socket is full: try again shortly (nothing was committed).
                assert self._loop is not None
                if self._flush_at is None:
                    self._flush_at = self._loop.call_later(self._retry_s, self._on_timer)
        except Exception:
            log.exception("episode %s: streaming failed", self.episode.id)

    def flush_now(self, *, final: bool = False) -> EpisodeDelta | bool | None:
        """Send everything new as one delta now (always one when ``final``).

        Returns the delta sent, None when there was nothing new, False when the socket
        could not take it (nothing committed; produce it again later).
        """
        d = self.sender.delta(final=final)
        if d is None:
            return None
        try:
            self._send(d, encode_frames(d))
        except zmq.Again:
            return False
        # Advance only after the send was queued, so a failed send is produced again.
        self.sender.commit(d)
        self.deltas += 1
        return d

    async def flush(self, *, final: bool = False) -> EpisodeDelta | None:
        """Like :meth:`flush_now`, waiting while the socket is full."""
        while True:
            d = self.flush_now(final=final)
            if d is not False:
                return d if isinstance(d, EpisodeDelta) else None
            await asyncio.sleep(self._retry_s)

    async def finish(self) -> None:
        """Stop the timers and unwatch; what is left goes in the final reply."""
        self._done = True
        for h in (self._flush_at, self._poll):
            if h is not None:
                h.cancel()
        self._flush_at = self._poll = None
        for _, unwatch in self._watched.values():
            unwatch()
        self._watched.clear()
