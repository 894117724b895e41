"""Ray suite fixtures: one Ray instance per session, inside the namespace test_ray.py made.

Both backends of the contract suite run here ({process, ray}); a pool of Ray actors is
kept for the whole session (``keep_actors``), so each test does not pay for new actors.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from tracewire.serve import EnvServer, LocalProcessPool, RayPool, ServerConfig, WorkerPool


def only_loopback() -> None:
    """Refuse to start Ray where it could see anything but ``lo``."""
    # if_nameindex asks the kernel about this process's namespace (sysfs may show another).
    names = [name for _, name in socket.if_nameindex()]
    if os.environ.get("TRACEWIRE_NETNS") != "1" or names != ["lo"]:
        pytest.fail(f"refusing to start Ray: interfaces {names} (run through "
                    "tests/serve/test_ray.py, which makes a namespace holding only lo)")


@pytest.fixture(scope="session")
def ray_instance() -> Iterator[Any]:
    only_loopback()
    import ray

    # "local": a new instance, never one a crashed earlier run left registered.
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.fixture(scope="session")
def ray_pool(ray_instance: Any) -> Iterator[RayPool]:
    pool = RayPool(num_cpus=1, keep_actors=True)
    yield pool
    pool.keep_actors = False


@pytest.fixture(params=["process", "ray"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def pool_of(backend: str, request: pytest.FixtureRequest) -> WorkerPool:
    if backend == "ray":
        pool: WorkerPool = request.getfixturevalue("ray_pool")
        return pool
    return LocalProcessPool()


@pytest.fixture
def make_server(backend: str, request: pytest.FixtureRequest) -> Any:
    """``async with make_server(**config) as srv``: a ready stand-in server of ``backend``."""

    @contextlib.asynccontextmanager
    async def make(factory: str | None = None, **config: Any) -> AsyncIterator[EnvServer]:
        server = EnvServer("standin", address="tcp://127.0.0.1:0",
                           config=ServerConfig(**config), factory=factory,
                           pool=pool_of(backend, request))
        await server.start()
        try:
            await server.wait_ready(timeout=60)
            yield server
        finally:
            await server.stop(drain=False, timeout=5)

    return make
