"""The event-loop lag probe: it sees a blocked loop and tells busy from blocked."""

from __future__ import annotations

import asyncio
import time

from tracewire.diagnostics import LoopLagProbe


async def test_loop_lag_probe_sees_a_blocked_loop() -> None:
    async with LoopLagProbe(interval=0.001) as probe:
        await asyncio.sleep(0.02)
        time.sleep(0.05)  # noqa: ASYNC251 - block the loop on purpose
        await asyncio.sleep(0.01)
    assert probe.samples > 2
    assert probe.max_ms >= 40.0
    assert probe.p50_ms <= probe.p99_ms <= probe.max_ms


async def test_loop_lag_probe_tells_a_busy_loop_from_a_blocked_one() -> None:
    # On a loaded machine a spinning thread gets only part of a core: measure that share
    # with a bare spin first and hold the probe to it, not to a fixed figure.
    wall0, cpu0 = time.perf_counter(), time.thread_time()
    while time.perf_counter() < wall0 + 0.1:
        sum(range(1000))
    share = (time.thread_time() - cpu0) / (time.perf_counter() - wall0)
    async with LoopLagProbe(interval=0.001) as spinning:
        end = time.perf_counter() + 0.1
        while time.perf_counter() < end:  # on the CPU the whole time
            sum(range(1000))
            await asyncio.sleep(0)
    async with LoopLagProbe(interval=0.001) as blocked:
        time.sleep(0.1)  # noqa: ASYNC251 - blocked, but off the CPU
        await asyncio.sleep(0.005)  # let the probe record the late timer
    assert spinning.busy > 0.6 * share
    assert blocked.busy < 0.3 and blocked.max_ms >= 90.0
