"""The worker-backend contract, the same for local processes and Ray actors.

Runs and groups stream and assemble, cancel, timeouts, busy and shutdown behave alike
whichever pool starts the workers; only placement differs.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tracewire import BusyError, Episode, RunTimeout, ServeError
from tracewire.codec import EpisodeDelta
from tracewire.serve import EnvClient

LONG = {"turns": 2000, "tokens": 10, "delay": 0.01}  # ~20 s unless stopped


async def until(pred: Any, what: str, limit: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while not pred():
        assert loop.time() < deadline, f"gave up waiting for {what}"
        await asyncio.sleep(0.02)


async def test_runs_and_groups_stream_and_assemble(make_server: Any, backend: str) -> None:
    async with make_server(workers=2) as srv, EnvClient(srv.address) as client:
        seqs: list[int] = []

        def on_delta(d: EpisodeDelta, ep: Episode) -> None:
            seqs.append(d.seq)

        res = await client.run({"key": "k", "turns": 6, "tokens": 50, "delay": 0.02},
                               on_delta=on_delta)
        t = res.episode.traces[0]
        assert len(t.nodes) == 12 and len(t.columns) == 6 * (8 + 50) and t.completed
        assert seqs == list(range(len(seqs))) and len(seqs) == res.deltas >= 2
        group = await client.run_group({"turns": 3, "tokens": 20}, 4, keep_frames=True)
        assert len({g.episode.group_id for g in group}) == 1
        assert [g.episode.group_index for g in group] == [0, 1, 2, 3]
        assert all(len(g.episode.traces[0].nodes) == 6 and g.frames for g in group)
        stats = await client.stats()
        assert stats["backend"] == backend and stats["workers_live"] == 2
        # Both workers took part in the group (least-loaded dispatch).
        assert sorted(w["done"] > 0 for w in stats["workers"]) == [True, True]


async def test_cancel(make_server: Any) -> None:
    async with make_server() as srv, EnvClient(srv.address) as client:
        first = asyncio.Event()
        task = asyncio.create_task(client.run(LONG, request_id="c-1",
                                              on_delta=lambda d, e: first.set()))
        await asyncio.wait_for(first.wait(), 30)
        assert await client.cancel("c-1") == 1
        with pytest.raises(ServeError, match="cancelled"):
            await task
        await until(lambda: srv.inflight == 0, "the cancelled run to stop")
        res = await client.run({"turns": 2, "tokens": 5})
        assert len(res.episode.traces[0].nodes) == 4


async def test_run_timeout(make_server: Any) -> None:
    async with make_server(run_timeout=0.5) as srv, EnvClient(srv.address) as client:
        with pytest.raises(RunTimeout, match="server's run timeout"):
            await client.run(LONG)
        await until(lambda: srv.inflight == 0, "the timed-out run to stop")
        assert srv.counters["workers_unresponsive"] == 0


async def test_hung_episode_times_out_then_its_worker_is_replaced(make_server: Any) -> None:
    factory = "tests.serve.ray._runners:stubborn_factory"
    async with make_server(factory=factory, run_timeout=0.5, cancel_grace=0.5) as srv, \
            EnvClient(srv.address) as client:
        (before,) = [w.id for w in srv.workers.all.values()]
        with pytest.raises(RunTimeout, match="server's run timeout"):
            await client.run({"turns": 1})
        # The worker never let go of the episode: killed, and a new one serves.
        await until(lambda: srv.counters["workers_unresponsive"] == 1, "the hung worker kill")
        await until(lambda: srv.inflight == 0 and srv.workers.count("ready") == 1
                    and before not in srv.workers.all, "a replacement worker")
        assert srv.workers.deaths == 1


async def test_busy(make_server: Any) -> None:
    async with make_server(max_inflight=1, max_queue=1) as srv, EnvClient(srv.address) as client:
        first = asyncio.Event()
        running = asyncio.create_task(client.run(LONG, on_delta=lambda d, e: first.set()))
        await asyncio.wait_for(first.wait(), 30)
        queued = asyncio.create_task(client.run({"turns": 2, "tokens": 5}))
        await until(lambda: len(srv.queue) == 1, "the second run to be queued")
        with pytest.raises(BusyError, match="busy"):
            await client.run({"turns": 1})
        running.cancel()
        res = await asyncio.wait_for(queued, 30)
        assert len(res.episode.traces[0].nodes) == 4
        with pytest.raises(asyncio.CancelledError):
            await running


async def test_shutdown_fails_inflight_runs_clearly(make_server: Any) -> None:
    async with make_server() as srv, EnvClient(srv.address) as client:
        first = asyncio.Event()
        task = asyncio.create_task(client.run(LONG, on_delta=lambda d, e: first.set()))
        await asyncio.wait_for(first.wait(), 30)
        await srv.stop(drain=True, timeout=0.2)
        with pytest.raises(ServeError, match="shut down"):
            await asyncio.wait_for(task, 30)
        assert not srv.workers.all
