"""Runs and groups stream deltas that assemble to exactly the server's final episodes."""

from __future__ import annotations

import asyncio

import numpy as np

from tests.codec.equality import assert_episode_equal
from tracewire import Episode
from tracewire.codec import EpisodeDelta, decode_record, frames_to_record, record_bytes
from tracewire.serve import EnvClient

from .conftest import client_of, serving, until


async def test_run_streams_deltas_that_assemble_to_the_final_episode() -> None:
    seen: list[tuple[EpisodeDelta, Episode, int]] = []

    def on_delta(d: EpisodeDelta, ep: Episode) -> None:
        seen.append((d, ep, len(ep.traces[0].nodes) if ep.traces else 0))

    async with serving() as srv, client_of(srv) as client:
        task = {"key": "t1", "turns": 6, "tokens": 50, "delay": 0.03}
        res = await client.run(task, on_delta=on_delta, keep_frames=True)
    ep = res.episode
    # Streamed turn by turn: several deltas, in sequence, growing the episode.
    assert len(seen) >= 3 and res.deltas == len(seen)
    assert [d.seq for d, _, _ in seen] == list(range(len(seen)))
    assert [n for _, _, n in seen] == sorted(n for _, _, n in seen)
    assert seen[0][2] < 12
    # What the deltas assembled is bit-equal to the episode the server encoded at the end.
    assembled = seen[-1][1]
    assert_episode_equal(assembled, ep)
    t = ep.traces[0]
    assert ep.task_key == "t1" and ep.env == "standin" and t.completed and t.reward == 1.0
    assert len(t.nodes) == 12 and len(t.calls) == 6 and len(t.columns) == 6 * (8 + 50)
    assert int(t.columns.mask.sum()) == 6 * 50
    assert np.isnan(t.columns.logprobs[:8]).all() and not np.isnan(t.columns.logprobs[8:58]).any()
    # The kept frames are the episode as it arrived; persisting them needs no re-encoding.
    assert res.frames is not None
    stored = decode_record(b"".join(frames_to_record(res.frames)))
    assert isinstance(stored, Episode)
    assert_episode_equal(stored, ep)


async def test_final_delta_and_wire_size_without_keep_frames() -> None:
    async with serving() as srv, client_of(srv) as client:
        res = await client.run({"turns": 40, "tokens": 1000})
    t = res.episode.traces[0]
    assert res.frames is None and res.deltas >= 1
    assert len(t.nodes) == 80 and len(t.columns) == 40 * 1008
    # Every token crossed the wire once: within a few percent of the binary record.
    assert res.wire_bytes < 1.05 * len(record_bytes(res.episode))


async def test_keep_frames_without_callback_sends_only_the_episode() -> None:
    async with serving() as srv, client_of(srv) as client:
        res = await client.run({"turns": 3, "tokens": 10}, keep_frames=True)
    assert res.deltas == 0 and res.frames is not None
    assert len(res.episode.traces[0].nodes) == 6


async def test_run_group_shares_a_group_id_and_streams_every_member() -> None:
    by_episode: dict[str, int] = {}

    def on_delta(d: EpisodeDelta, ep: Episode) -> None:
        by_episode[ep.id] = by_episode.get(ep.id, 0) + 1

    async with serving(workers=2) as srv, client_of(srv) as client:
        results = await client.run_group({"key": "g", "turns": 4, "tokens": 20, "delay": 0.01},
                                         4, on_delta=on_delta, group_id="grp-1")

        async def all_done() -> bool:
            # On the direct path the client has the replies before the broker has the
            # workers' DONE notes: its counters catch up a moment later.
            return sum(w["done"] for w in (await client.stats())["workers"]) == 4

        await until(all_done, "the broker to count the group's episodes")
        stats = await client.stats()
    assert [r.episode.group_index for r in results] == [0, 1, 2, 3]
    assert {r.episode.group_id for r in results} == {"grp-1"}
    assert len({r.episode.id for r in results}) == 4
    assert set(by_episode) == {r.episode.id for r in results}
    assert all(len(r.episode.traces[0].nodes) == 8 for r in results)
    # The group's episodes were spread over both workers.
    assert sorted(w["done"] for w in stats["workers"]) == [2, 2]


async def test_client_spreads_runs_over_several_servers() -> None:
    async with serving() as a, serving() as b:
        async with EnvClient([a.address, b.address]) as client:
            results = await asyncio.gather(
                *(client.run({"turns": 3, "tokens": 10, "delay": 0.02}) for _ in range(4)))
            health = await client.health()
        assert all(len(r.episode.traces[0].nodes) == 6 for r in results)
        assert {r.server for r in results} == {a.address, b.address}
        assert health["healthy"] and set(health["servers"]) == {a.address, b.address}
        assert a.counters["runs"] == 2 and b.counters["runs"] == 2
