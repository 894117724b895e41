"""Streams one episode from a worker as deltas while its runner fills it.

Watchers on the episode's traces set a dirty flag; one flush task per episode wakes on it,
waits ``coalesce_s`` so a burst of turns becomes one delta, then sends everything new. A
slow poll also catches new traces and phase changes that nobody notified. Each flush costs
O(new data) (see :class:`tracewire.codec.EpisodeSender`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from ..codec import EpisodeDelta, EpisodeSender, encode_frames
from ..trace import Episode, Trace

__all__ = ["EpisodeStreamer", "SendDelta"]

log = logging.getLogger("tracewire.serve")

#: Sends one delta's frames; returns when the frames are queued on the socket.
SendDelta = Callable[[EpisodeDelta, list[Any]], Awaitable[None]]


class EpisodeStreamer:
    """Watches ``episode`` and sends its deltas through ``send`` until :meth:`finish`."""

    def __init__(self, episode: Episode, send: SendDelta, *, stream: bool = True,
                 coalesce_s: float = 0.002, poll_s: float = 0.05) -> None:
        self.episode = episode
        self.sender = EpisodeSender(episode)
        self.deltas = 0
        self._send = send
        self._stream = stream
        self._coalesce_s = coalesce_s
        self._poll_s = poll_s
        self._dirty = asyncio.Event()
        self._done = asyncio.Event()
        self._watched: dict[str, tuple[Trace, Callable[[], None]]] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the flush task (a no-op when not streaming)."""
        if self._stream:
            self._task = asyncio.create_task(self._loop(), name=f"stream-{self.episode.id}")

    def _on_notify(self, _trace: Trace) -> None:
        self._dirty.set()

    def _watch_new(self) -> None:
        for t in self.episode.traces:
            have = self._watched.get(t.id)
            if have is None or have[0] is not t:
                self._watched[t.id] = (t, t.watch(self._on_notify))

    async def _loop(self) -> None:
        while not self._done.is_set():
            self._watch_new()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._poll_s):
                    await self._dirty.wait()
            if self._done.is_set():
                return
            if self._coalesce_s > 0:
                # Coalesce a burst of turns into one delta; an episode that ends meanwhile
                # goes out whole in the final reply instead (one message for short ones).
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._coalesce_s):
                        await self._done.wait()
                if self._done.is_set():
                    return
            self._dirty.clear()
            self._watch_new()
            await self.flush()

    async def flush(self, *, final: bool = False) -> EpisodeDelta | None:
        """Send everything new as one delta (always one when ``final``)."""
        d = self.sender.delta(final=final)
        if d is None:
            return None
        await self._send(d, encode_frames(d))
        # Advance only after the send was queued, so a failed send is produced again.
        self.sender.commit(d)
        self.deltas += 1
        return d

    async def finish(self) -> None:
        """Stop the flush task (letting a flush in progress complete) and unwatch."""
        self._done.set()
        if self._task is not None:
            try:
                await self._task
            except Exception:
                log.exception("episode %s: streaming failed", self.episode.id)
        for _, unwatch in self._watched.values():
            unwatch()
        self._watched.clear()
