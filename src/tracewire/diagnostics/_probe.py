"""Event-loop lag probe: how late does a timer fire while the loop is busy elsewhere?"""

from __future__ import annotations

import asyncio
import time
from array import array
from types import TracebackType

import numpy as np

__all__ = ["LoopLagProbe"]


class LoopLagProbe:
    """Samples event-loop lag (timer lateness) every ``interval`` seconds while active.

    ``async with LoopLagProbe() as probe: ...`` then read ``p50_ms``, ``p99_ms``, ``max_ms``
    (lateness beyond the requested interval, in ms), ``samples`` and ``busy`` (the share
    of the time the loop's thread spent on the CPU: lag with ``busy`` near 1 is a saturated
    loop, queueing; lag with ``busy`` low is something blocking it).
    """

    def __init__(self, interval: float = 0.001) -> None:
        self.interval = interval
        self._lags = array("d")
        self._task: asyncio.Task[None] | None = None
        # (thread CPU time, wall time) at start, and the spans measured so far.
        self._since: tuple[float, float] | None = None
        self._cpu = 0.0
        self._wall = 0.0

    async def __aenter__(self) -> LoopLagProbe:
        self.start()
        await asyncio.sleep(0)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def start(self) -> None:
        """Start sampling on the running loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())
            self._since = (time.thread_time(), time.perf_counter())

    async def stop(self) -> None:
        """Stop sampling (figures stay available)."""
        task, self._task = self._task, None
        if self._since is not None:
            # Called on the loop's thread, like start(): thread_time is that thread's CPU.
            self._cpu += time.thread_time() - self._since[0]
            self._wall += time.perf_counter() - self._since[1]
            self._since = None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass

    async def _run(self) -> None:
        clock, interval, lags = time.perf_counter, self.interval, self._lags
        while True:
            t0 = clock()
            await asyncio.sleep(interval)
            lags.append(max(0.0, clock() - t0 - interval))

    def reset(self) -> None:
        """Forget the samples taken so far."""
        del self._lags[:]
        self._cpu = self._wall = 0.0
        if self._since is not None:
            self._since = (time.thread_time(), time.perf_counter())

    @property
    def busy(self) -> float:
        """Share of wall time the loop's thread was on the CPU while sampling (0..1). Read
        it on the loop's thread while sampling runs (thread CPU time is per thread)."""
        cpu, wall = self._cpu, self._wall
        if self._since is not None:
            cpu += time.thread_time() - self._since[0]
            wall += time.perf_counter() - self._since[1]
        return min(1.0, cpu / wall) if wall > 0 else 0.0

    @property
    def samples(self) -> int:
        """Number of lag samples taken."""
        return len(self._lags)

    def _pct(self, q: float) -> float:
        if not self._lags:
            return 0.0
        return float(np.percentile(np.array(self._lags, dtype=np.float64), q) * 1e3)

    @property
    def p50_ms(self) -> float:
        """Median lag in milliseconds."""
        return self._pct(50)

    @property
    def p99_ms(self) -> float:
        """99th-percentile lag in milliseconds."""
        return self._pct(99)

    @property
    def max_ms(self) -> float:
        """Worst lag in milliseconds."""
        return max(self._lags, default=0.0) * 1e3
