"""A node lost from a (fake, two-node) cluster: its episodes fail fast, the other node's not.

``ray.cluster_utils.Cluster`` runs a head (no CPUs, so no actors) and two worker nodes of one
CPU each in this namespace, so the pool's two one-CPU actors land one per node.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tracewire import WorkerDiedError
from tracewire.serve import EnvClient, EnvServer, RayPool, ServerConfig

from .conftest import only_loopback
from .test_contract import until


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    only_loopback()
    import ray
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    nodes = [c.add_node(num_cpus=1) for _ in range(2)]
    ray.init(address=c.address, log_to_driver=False)
    c.wait_for_nodes()
    try:
        yield c, nodes
    finally:
        ray.shutdown()
        c.shutdown()


async def test_removed_node_fails_its_episodes_fast_others_unaffected(cluster: Any) -> None:
    c, nodes = cluster
    pool = RayPool(num_cpus=1)
    cfg = ServerConfig(workers=2, heartbeat_timeout=2.0)
    async with EnvServer("standin", address="tcp://127.0.0.1:0", config=cfg, pool=pool) as srv:
        await srv.wait_ready(timeout=90)
        handles = [w.handle for w in srv.workers.all.values()]
        assert {h.node_id for h in handles} == {n.node_id for n in nodes}  # type: ignore
        async with EnvClient(srv.address) as client:
            started = [asyncio.Event(), asyncio.Event()]
            task = {"turns": 300, "tokens": 10, "delay": 0.02}  # ~6 s each
            runs = [asyncio.create_task(client.run(task, on_delta=lambda d, e, ev=ev: ev.set()))
                    for ev in started]
            await asyncio.wait_for(asyncio.gather(*(ev.wait() for ev in started)), 30)
            on_node = {srv.workers.get(j.worker).handle.node_id: j.rid  # type: ignore
                       for j in srv.jobs.values() if j.worker is not None}
            assert len(on_node) == 2  # one episode on each node
            lost, kept = nodes[1], nodes[0]
            t0 = time.monotonic()
            await asyncio.to_thread(c.remove_node, lost, False)
            await asyncio.wait(runs, timeout=30, return_when=asyncio.FIRST_EXCEPTION)
            failed = [r for r in runs if r.done() and r.exception() is not None]
            assert len(failed) == 1
            with pytest.raises(WorkerDiedError):
                failed[0].result()
            died_after = time.monotonic() - t0
            (survivor,) = [r for r in runs if r is not failed[0]]
            res = await asyncio.wait_for(survivor, 30)  # the other node's episode completes
            assert len(res.episode.traces[0].nodes) == 600
            assert on_node[kept.node_id] == res.request_id
            # New work goes to the live worker.
            again = await asyncio.wait_for(client.run({"turns": 2, "tokens": 5}), 30)
            assert len(again.episode.traces[0].nodes) == 4
            await until(lambda: srv.workers.count("ready") >= 1, "a live worker")
            print(f"node loss -> client error: {died_after:.2f}s")
