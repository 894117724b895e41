"""Under ``--backend ray`` too, an impostor on the host gets no job and injects no frame.

The actors' worker endpoint is TCP (loopback here, inside the test namespace), so it is a
CURVE server; each actor gets its keys as the argument of its ``serve`` call, never on a
command line or in an environment. The impostor (tests/serve/impostor.py, its own process)
reads every actor process's ``/proc/PID/cmdline`` and ``environ`` and connects as every
worker id, then as a killed actor's id with that actor's own stolen key.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest

from tracewire.serve import EnvClient, EnvServer, RayPool, ServerConfig, WorkerHandle
from tracewire.serve._config import WorkerConfig

from ..test_trust import assert_genuine, impostor, refused
from .test_contract import until


async def test_impostor_gets_no_job_from_ray_workers(ray_pool: RayPool,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    configs: dict[str, WorkerConfig] = {}
    start = ray_pool.start

    async def recording_start(config: WorkerConfig) -> WorkerHandle:
        configs[config.worker_id] = config  # kept only to check that no secret leaked
        return await start(config)

    monkeypatch.setattr(ray_pool, "start", recording_start)
    cfg = ServerConfig(workers=2, heartbeat_timeout=2.0)
    async with EnvServer("standin", address="tcp://127.0.0.1:0", config=cfg,
                         pool=ray_pool) as srv:
        await srv.wait_ready(timeout=120)
        assert srv.worker_endpoint.startswith("tcp://127.0.0.1:")
        assert srv.health()["curve"] == {"clients": True, "workers": True}
        async with EnvClient(srv.address) as client:
            ids = list(srv.workers.all)
            async with impostor(srv, ids) as report:
                await until(lambda: refused(srv) >= 4, "the impostor's handshakes refused")
                results = [await client.run({"turns": 3, "tokens": 20}) for _ in range(4)]
                results += await client.run_group({"turns": 2, "tokens": 10}, 4)
            assert report["jobs"] == report["messages"] == 0
            assert_genuine([r.episode for r in results])
            # Through the broker (workers may be remote): it forwarded exactly what the
            # client received, so no forged frame went along.
            assert srv.counters["bytes_forwarded"] == sum(r.wire_bytes for r in results)
            seen = report["seen"]
            assert len([k for k in seen if k.endswith("cmdline")]) == 2
            assert all(not v.startswith("<") for v in seen.values())
            for wc in configs.values():
                assert wc.secret_key and all(wc.secret_key not in v for v in seen.values())

            # A killed actor's id and key open nothing once its death is seen.
            victim = srv.workers.all[ids[0]]
            stolen = configs[victim.id]
            assert victim.pid is not None
            os.kill(victim.pid, signal.SIGKILL)
            await until(lambda: victim.id not in srv.workers.all, "the actor's death seen")
            keys: list[dict[str, Any]] = [{"id": victim.id, "public": stolen.public_key,
                                           "secret": stolen.secret_key}]
            async with impostor(srv, [victim.id], keys) as report:
                await until(lambda: srv.stats()["handshakes_denied"]["workers"] >= 2,
                            "the dead actor's key to be refused")
                await srv.wait_ready(2, timeout=120)
                more = [await client.run({"turns": 2, "tokens": 10}) for _ in range(3)]
            assert report["jobs"] == report["messages"] == 0
            assert_genuine([r.episode for r in more])
            assert victim.id not in srv.workers.all and srv.workers.deaths >= 1
