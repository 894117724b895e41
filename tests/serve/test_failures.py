"""Cancel, worker death, dead pools, overload and timeouts end in clear errors, never hangs."""

from __future__ import annotations

import asyncio
import math
import os
import signal

import pytest

from tracewire import BusyError, RunTimeout, ServeError, WorkerDiedError
from tracewire.serve import DEFAULT_TIMEOUT, ServerConfig

from .conftest import client_of, serving, until

LONG = {"turns": 2000, "tokens": 10, "delay": 0.01}  # ~20 s unless stopped


async def test_cancelling_an_awaiting_run_cancels_it_on_the_server() -> None:
    async with serving() as srv, client_of(srv) as client:
        first = asyncio.Event()
        task = asyncio.create_task(client.run(LONG, on_delta=lambda d, e: first.set()))
        await asyncio.wait_for(first.wait(), 20)
        assert srv.inflight == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await until(lambda: srv.inflight == 0, "the worker to stop the cancelled run")
        assert srv.counters["cancelled"] == 1
        # The pool is fine afterwards.
        res = await client.run({"turns": 2, "tokens": 5})
        assert len(res.episode.traces[0].nodes) == 4


async def test_cancel_by_request_id_fails_the_run_clearly() -> None:
    async with serving() as srv, client_of(srv) as client:
        first = asyncio.Event()
        task = asyncio.create_task(client.run(LONG, request_id="r-1",
                                              on_delta=lambda d, e: first.set()))
        await asyncio.wait_for(first.wait(), 20)
        assert await client.cancel("r-1") == 1
        with pytest.raises(ServeError, match="cancelled"):
            await task
        await until(lambda: srv.inflight == 0, "the cancelled run to stop")


async def test_killed_worker_fails_its_run_and_is_replaced() -> None:
    async with serving() as srv, client_of(srv) as client:
        first = asyncio.Event()
        task = asyncio.create_task(client.run(LONG, on_delta=lambda d, e: first.set()))
        await asyncio.wait_for(first.wait(), 20)
        (worker,) = (await client.stats())["workers"]
        os.kill(worker["pid"], signal.SIGKILL)
        with pytest.raises(WorkerDiedError, match=f"pid {worker['pid']}"):
            await asyncio.wait_for(task, 20)  # an error, not a hang
        res = await client.run({"turns": 2, "tokens": 5})
        assert len(res.episode.traces[0].nodes) == 4
        stats = await client.stats()
        assert stats["worker_deaths"] == 1 and stats["worker_starts"] == 2
        assert [w["pid"] for w in stats["workers"]] != [worker["pid"]]


async def test_health_says_unhealthy_when_no_worker_is_alive() -> None:
    async with serving(options={"fail_start": True}, ready=False, queue_timeout=0.5) as srv, \
            client_of(srv) as client:
        await until(lambda: srv.workers.last_error is not None, "a worker to fail")
        health = await client.health()
        assert health["healthy"] is False and health["workers_live"] == 0
        assert "fail at start-up" in health["last_worker_error"]
        # A run waits in the queue for a worker that never comes, then is refused clearly.
        with pytest.raises(BusyError, match="no free worker"):
            await client.run({"turns": 1})


async def test_all_workers_killed_runs_fail_and_health_recovers() -> None:
    async with serving(workers=2) as srv, client_of(srv) as client:
        firsts = [asyncio.Event(), asyncio.Event()]
        tasks = [asyncio.create_task(client.run(LONG, on_delta=lambda d, e, ev=ev: ev.set()))
                 for ev in firsts]
        await asyncio.wait_for(asyncio.gather(*(ev.wait() for ev in firsts)), 20)
        for w in (await client.stats())["workers"]:
            os.kill(w["pid"], signal.SIGKILL)
        for t in tasks:
            with pytest.raises(WorkerDiedError):
                await asyncio.wait_for(t, 20)
        await until(lambda: srv.workers.count("ready") == 2, "replacements")
        assert (await client.health())["healthy"] is True


async def test_overload_queues_then_refuses_busy() -> None:
    async with serving(max_inflight=1, max_queue=1) as srv, client_of(srv) as client:
        first = asyncio.Event()
        running = asyncio.create_task(client.run(LONG, on_delta=lambda d, e: first.set()))
        await asyncio.wait_for(first.wait(), 20)
        queued = asyncio.create_task(client.run({"turns": 2, "tokens": 5}))
        await until(lambda: len(srv.queue) == 1, "the second run to be queued")
        with pytest.raises(BusyError, match="busy"):
            await client.run({"turns": 1})
        assert (await client.health())["queued"] == 1
        running.cancel()
        res = await asyncio.wait_for(queued, 20)  # it ran once the slot was free
        assert len(res.episode.traces[0].nodes) == 4
        with pytest.raises(asyncio.CancelledError):
            await running


async def test_server_run_timeout() -> None:
    async with serving(run_timeout=0.3) as srv, client_of(srv) as client:
        with pytest.raises(RunTimeout, match="server's run timeout"):
            await client.run(LONG)
        await until(lambda: srv.inflight == 0, "the timed-out run to stop")


async def test_client_timeout_cancels_on_the_server() -> None:
    async with serving() as srv, client_of(srv) as client:
        with pytest.raises(RunTimeout, match="client-side"):
            await client.run(LONG, timeout=0.3)
        await until(lambda: srv.inflight == 0, "the abandoned run to stop")


def test_timeouts_default_to_finite_values() -> None:
    assert math.isfinite(DEFAULT_TIMEOUT) and math.isfinite(ServerConfig().run_timeout)
    assert ServerConfig().run_timeout < DEFAULT_TIMEOUT
    with pytest.raises(ValueError, match="finite"):
        ServerConfig(run_timeout=math.inf)


async def test_scales_up_under_load_and_down_when_idle() -> None:
    async with serving(workers=1, max_workers=2, max_inflight=2, idle_s=0.3) as srv, \
            client_of(srv) as client:
        assert srv.config.slots_per_worker == 1
        firsts = [asyncio.Event(), asyncio.Event()]
        task = {"turns": 30, "tokens": 5, "delay": 0.05}  # 1.5 s each

        def cb(ev: asyncio.Event) -> object:
            return lambda d, e: ev.set()

        runs = [asyncio.create_task(client.run(task, on_delta=cb(ev))) for ev in firsts]
        await until(lambda: srv.workers.starts == 2, "a second worker under load")
        results = await asyncio.gather(*runs)
        assert all(len(r.episode.traces[0].nodes) == 60 for r in results)
        await until(lambda: srv.workers.count("ready") == 1 and len(srv.workers.all) == 1,
                    "the idle worker to be retired")
        assert srv.workers.deaths == 0 and srv.workers.starts == 2
