"""serve_env: an environment and a backend in, a connected client of ready workers out."""

from __future__ import annotations

import pytest

from tracewire import ServeError
from tracewire.serve import InlinePool, LocalProcessPool, make_pool, serve_env


@pytest.mark.parametrize("backend", ["process", "inline"])
async def test_serve_env_yields_a_client_of_ready_workers(backend: str) -> None:
    async with serve_env("standin", backend=backend, workers=2) as client:
        health = await client.health()
        assert health["workers_live"] == 2 and health["backend"] == backend
        # A private ipc socket: only this user reaches it, so no CURVE is needed there.
        assert client.addresses[0].startswith("ipc://") and health["curve"]["clients"] is False
        res = await client.run({"turns": 3, "tokens": 10}, keep_frames=True)
        assert len(res.episode.traces[0].nodes) == 6 and res.frames


async def test_serve_env_raises_when_workers_never_start() -> None:
    with pytest.raises(ServeError, match="not ready after"):
        async with serve_env("standin", options={"fail_start": True}, ready_timeout=3.0):
            pass


def test_make_pool_knows_the_backends() -> None:
    assert isinstance(make_pool("process"), LocalProcessPool)
    assert isinstance(make_pool("inline"), InlinePool)
    pool = make_pool("ray", worker_cpus=0.5, worker_resources={"env": 1})
    assert pool.name == "ray" and pool.same_host is False
    with pytest.raises(ValueError, match="unknown worker backend"):
        make_pool("kubernetes")
