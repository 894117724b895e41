"""An actor that dies mid-episode: the client hears of it fast, the restarted actor serves on.

At most once: the dead actor's episode is failed (never replayed), and the next episode
runs on the same actor slot in a new process, with its own consistent delta sequence.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tests.codec.equality import assert_episode_equal
from tracewire import Episode, WorkerDiedError
from tracewire.codec import EpisodeDelta
from tracewire.serve import EnvClient, EnvServer, RayPool, ServerConfig, serve_env
from tracewire.store import Run, open_run

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



async def test_serve_env_over_ray_frames_persist_as_received(ray_pool: RayPool,
                                                              tmp_path: Path) -> None:
    async with serve_env("standin", backend="ray", workers=2, pool=ray_pool) as client:
        health = await client.health()
        assert health["backend"] == "ray" and health["workers_live"] == 2
        group = await client.run_group({"key": "g", "turns": 2, "tokens": 5}, 3,
                                       keep_frames=True)
    assert [len(g.episode.traces[0].nodes) for g in group] == [4, 4, 4]
    run = await Run.create(tmp_path / "r")
    for g in group:
        assert g.frames is not None
        await run.append_frames(g.frames)  # what eval --backend ray does with them
    await run.close()
    with open_run(tmp_path / "r") as r:
        assert [row.episode_id for row in r.rows()] == [g.episode.id for g in group]
        for g in group:
            assert_episode_equal(r.get(g.episode.id), g.episode)
