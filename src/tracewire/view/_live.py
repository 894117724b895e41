"""Live feed: polls the run's in-flight episodes off the event loop and wakes SSE streams.

One poller per app, running only while someone listens. Each poll assembles the live
episodes from the journal in a worker thread, compares a cheap signature per episode and,
for the ones that changed, precomputes what the streams send (so ten viewers of one episode
cost one summary, not ten). Streams coalesce: a slow client skips intermediate states and
gets the latest one, so nothing queues up without bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field, replace
from typing import Any

from ._health import HealthState
from ._shapes import episode_summary, live_row, signature
from ._source import RunSource

__all__ = ["LiveFeed", "LiveState"]

log = logging.getLogger("tracewire.view")


@dataclass
class LiveState:
    """What the feed knows after a poll; replaced (never mutated) on every change."""

    version: int = 0
    poll: int = 0
    rows: list[dict[str, Any]] = field(default_factory=list)
    summaries: dict[str, dict[str, Any]] = field(default_factory=dict)
    sigs: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    index_rows: int = 0
    gone: frozenset[str] = frozenset()
    health: dict[str, Any] = field(default_factory=dict)
    steps: tuple[int, int] = (0, 0)


class LiveFeed:
    """Shared poller of ``run.live()``; :meth:`wait` blocks a stream until the next change."""

    def __init__(self, source: RunSource, interval: float = 0.25, max_streams: int = 256) -> None:
        self.source = source
        self.interval = interval
        self.max_streams = max_streams
        self.state = LiveState()
        self._seen: set[str] = set()
        self._streams = 0
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def streams(self) -> int:
        """Number of open streams."""
        return self._streams

    def acquire(self) -> bool:
        """Register a stream (False when at the bound); starts the poller if needed."""
        if self._closed or self._streams >= self.max_streams:
            return False
        self._streams += 1
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())
        return True

    def release(self) -> None:
        """Unregister a stream; the poller stops by itself once nobody listens."""
        self._streams -= 1

    async def wait(self, poll: int, timeout: float) -> LiveState:
        """The state once a poll later than ``poll`` finished (or after ``timeout``)."""
        async with self._changed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._changed.wait_for(lambda: self.state.poll > poll or self._closed),
                    timeout,
                )
            return self.state

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran."""
        return self._closed

    async def close(self) -> None:
        """Stop polling and release every waiting stream."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        async with self._changed:
            self._changed.notify_all()

    def _poll(self, old: LiveState) -> LiveState:
        # Runs in a worker thread: journal assembly, signatures and summaries are all O(data).
        episodes = self.source.live()
        index_rows = self.source.index_count()
        health = self.source.health()
        steps = self.source.steps_signature()
        stale = health["state"] == HealthState.NEEDS_REPAIR
        sigs: dict[str, tuple[Any, ...]] = {}
        summaries: dict[str, dict[str, Any]] = {}
        rows: list[dict[str, Any]] = []
        changed = index_rows != old.index_rows or health != old.health or steps != old.steps
        for ep in episodes:
            sig = signature(ep)
            sigs[ep.id] = sig
            rows.append(live_row(ep))
            if old.sigs.get(ep.id) == sig and old.summaries[ep.id]["stale"] == stale:
                summaries[ep.id] = old.summaries[ep.id]
            else:
                summaries[ep.id] = {**episode_summary(ep, live=True), "stale": stale}
                changed = True
        if set(sigs) != set(old.sigs):
            changed = True
        if not changed:
            return replace(old, poll=old.poll + 1)
        self._seen |= set(sigs)
        return LiveState(
            version=old.version + 1,
            poll=old.poll + 1,
            rows=rows,
            summaries=summaries,
            sigs=sigs,
            index_rows=index_rows,
            gone=frozenset(self._seen - set(sigs)),
            health=health,
            steps=steps,
        )

    async def _run(self) -> None:
        while self._streams > 0 and not self._closed:
            try:
                new = await asyncio.to_thread(self._poll, self.state)
            except Exception:
                # A torn journal read or a busy index must not end the feed: retry next tick.
                log.exception("live poll failed")
                new = replace(self.state, poll=self.state.poll + 1)
            async with self._changed:
                self.state = new
                self._changed.notify_all()
            await asyncio.sleep(self.interval)
