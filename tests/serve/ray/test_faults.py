"""An actor that dies mid-episode: the client hears of it fast, the restarted actor serves on.

At most once: the dead actor's episode is failed (never replayed), and the next episode
runs on the same actor slot in a new process, with its own consistent delta sequence.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from tracewire import Episode, WorkerDiedError
from tracewire.codec import EpisodeDelta
from tracewire.serve import EnvClient, EnvServer, RayPool, ServerConfig

from .test_contract import LONG, until


async def test_actor_exit_mid_episode_fails_fast_and_the_restarted_actor_serves(
        ray_pool: RayPool) -> None:
    async with EnvServer("standin", address="tcp://127.0.0.1:0", config=ServerConfig(workers=1),
                         pool=ray_pool) as srv:
        await srv.wait_ready(timeout=60)
        async with EnvClient(srv.address) as client:
            seqs: list[int] = []
            first = asyncio.Event()

            def on_delta(d: EpisodeDelta, ep: Episode) -> None:
                seqs.append(d.seq)
                first.set()

            task = asyncio.create_task(client.run(LONG, on_delta=on_delta))
            await asyncio.wait_for(first.wait(), 30)
            (w,) = srv.workers.all.values()
            assert w.handle is not None
            slot, pid = w.handle.slot, w.pid  # type: ignore[attr-defined]
            t0 = time.monotonic()
            ray_pool.actors[slot].exit_now.remote(1)  # os._exit inside the actor
            with pytest.raises(WorkerDiedError, match=f"worker {w.id}"):
                await asyncio.wait_for(task, 5.0)  # the bound on hearing of it
            died_after = time.monotonic() - t0
            # Deltas received before the death were in order, none lost or repeated.
            assert seqs == list(range(len(seqs))) and seqs
            await until(lambda: srv.workers.count("ready") == 1, "the restarted actor", 60)
            seqs.clear()
            res = await client.run({"turns": 5, "tokens": 20, "delay": 0.02}, on_delta=on_delta)
            assert len(res.episode.traces[0].nodes) == 10
            assert seqs == list(range(len(seqs))) and res.deltas == len(seqs)
            (w2,) = srv.workers.all.values()
            assert w2.id != w.id and w2.handle is not None
            assert w2.handle.slot == slot and w2.pid != pid  # type: ignore[attr-defined]
            assert srv.workers.deaths == 1
            health = await client.health()
            assert health["healthy"] and health["workers_live"] == 1
            print(f"actor death -> client error: {died_after:.2f}s")



async def test_serve_env_over_ray(ray_pool: RayPool) -> None:
    from tracewire.serve import serve_env

    async with serve_env("standin", backend="ray", workers=2, pool=ray_pool) as client:
        health = await client.health()
        assert health["backend"] == "ray" and health["workers_live"] == 2
        group = await client.run_group({"turns": 2, "tokens": 5}, 3, keep_frames=True)
        assert [len(g.episode.traces[0].nodes) for g in group] == [4, 4, 4]
        assert all(g.frames for g in group)  # for Run.append_frames
