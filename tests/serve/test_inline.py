"""Workers as tasks in the broker's process (InlinePool) serve the same protocol."""

from __future__ import annotations

from tests.codec.equality import assert_episode_equal
from tracewire import Episode
from tracewire.codec import EpisodeDelta, record_bytes
from tracewire.serve import EnvClient, EnvServer, InlinePool, ServerConfig

from .conftest import ADDRESS, until


async def test_inline_workers_stream_runs_and_groups_then_stop_cleanly() -> None:
    seen: list[tuple[int, Episode]] = []

    def on_delta(d: EpisodeDelta, ep: Episode) -> None:
        seen.append((d.seq, ep))

    server = EnvServer("standin", address=ADDRESS, config=ServerConfig(workers=2),
                       pool=InlinePool())
    await server.start()
    try:
        await server.wait_ready(timeout=30)
        async with EnvClient(server.address) as client:
            res = await client.run({"turns": 8, "tokens": 30, "delay": 0.01},
                                   on_delta=on_delta)
            group = await client.run_group({"turns": 50, "tokens": 1000}, 3)

            async def counted() -> bool:
                # Replies come straight from the workers; the broker counts their DONE notes
                # a moment later.
                return sum(w["done"] for w in (await client.stats())["workers"]) == 4

            await until(counted, "the broker to count all four episodes")
            stats = await client.stats()
    finally:
        await server.stop(timeout=10)
    ep = res.episode
    assert len(seen) >= 2 and [s for s, _ in seen] == list(range(len(seen)))
    assert_episode_equal(seen[-1][1], ep)
    assert len(ep.traces[0].nodes) == 16 and ep.traces[0].completed
    assert [r.episode.group_index for r in group] == [0, 1, 2]
    for r in group:
        assert len(r.episode.traces[0].columns) == 50 * 1008
        assert r.wire_bytes < 1.05 * len(record_bytes(r.episode))
    assert len(stats["workers"]) == 2 and all(w["pid"] is None for w in stats["workers"])
    assert sum(w["done"] for w in stats["workers"]) == 4
    assert server.workers.all == {} and server.workers.deaths == 0
