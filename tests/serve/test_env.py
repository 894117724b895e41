"""A real environment (built-in model, proxy, tracewire.env rollout) served end to end."""

from __future__ import annotations

from tracewire.codec import EpisodeDelta
from tracewire.compose import env_factory
from tracewire.serve import EnvClient, EnvServer
from tracewire.trace import Episode

from .conftest import ADDRESS


async def test_arithmetic_episode_streams_from_a_real_rollout() -> None:
    deltas: list[EpisodeDelta] = []

    def on_delta(d: EpisodeDelta, ep: Episode) -> None:
        deltas.append(d)

    async with EnvServer("arithmetic", address=ADDRESS, factory=env_factory) as srv:
        await srv.wait_ready(timeout=120)
        async with EnvClient(srv.address) as client:
            res = await client.run({"key": "a1", "question": "2 + 3", "answer": "5"},
                                   on_delta=on_delta, timeout=120)
    ep = res.episode
    assert ep.env == "arithmetic" and deltas and res.deltas == len(deltas)
    trace = ep.traces[0]
    assert trace.calls and trace.calls[0].node is not None
    assert len(trace.columns) > 0 and int(trace.columns.mask.sum()) > 0
