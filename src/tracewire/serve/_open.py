"""One call from "an environment and a backend" to a connected :class:`EnvClient`.

For callers that want rollouts from workers without running a server themselves (the eval
command, a notebook, a trainer on the head node): :func:`serve_env` starts an
:class:`EnvServer` with the chosen backend on a private ``ipc://`` socket (in a 0700
directory: only this user can reach it, and no CURVE costs on the client hop), waits for its
workers, and yields a client connected to it; leaving the block stops both.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator
from enum import StrEnum
from typing import Any

from ._broker import EnvServer
from ._client import DEFAULT_TIMEOUT, EnvClient
from ._config import ServerConfig
from ._pool import InlinePool, LocalProcessPool, WorkerPool
from ._runner import RunnerFactory

__all__ = ["WORKER_BACKENDS", "WorkerBackend", "make_pool", "serve_env"]



class WorkerBackend(StrEnum):
    """Where an env server's workers run: local processes, tasks in its own process, Ray
    actors (compose's ``Backend`` says where rollouts run; its process and ray use these)."""

    PROCESS = "process"
    INLINE = "inline"
    RAY = "ray"


#: The worker backends ``tracewire serve --backend`` and :func:`serve_env` know.
WORKER_BACKENDS: tuple[WorkerBackend, ...] = tuple(WorkerBackend)


def make_pool(backend: str = "process", *, ray_address: str | None = None,
              worker_cpus: float = 1.0,
              worker_resources: dict[str, float] | None = None) -> WorkerPool:
    """The worker pool of ``backend`` (a :class:`WorkerBackend` value); the Ray options
    apply only to ``"ray"``."""
    if backend == WorkerBackend.PROCESS:
        return LocalProcessPool()
    if backend == WorkerBackend.INLINE:
        return InlinePool()
    if backend == WorkerBackend.RAY:
        from ._ray import RayPool  # imports nothing of Ray until the pool is used

        return RayPool(address=ray_address, num_cpus=worker_cpus, resources=worker_resources)
    raise ValueError(f"unknown worker backend {backend!r} (one of {', '.join(WORKER_BACKENDS)})")


@contextlib.asynccontextmanager
async def serve_env(env: str, *, backend: str = "process", workers: int = 1,
                    config: ServerConfig | None = None,
                    factory: RunnerFactory | str | None = None,
                    options: dict[str, Any] | None = None, pool: WorkerPool | None = None,
                    ray_address: str | None = None, worker_cpus: float = 1.0,
                    worker_resources: dict[str, float] | None = None,
                    ready_timeout: float = 120.0,
                    client_timeout: float | None = None) -> AsyncIterator[EnvClient]:
    """Serve ``env`` from ``workers`` workers of ``backend`` and yield a connected client.

    ``config`` overrides the server settings (its ``workers`` wins over ``workers``);
    ``pool`` overrides ``backend``. Joining Ray blocks for seconds once per process (on
    the calling thread, which Ray wants to be the main one): to keep that off a busy loop,
    build the pool with :func:`make_pool`, call its ``prepare()`` before the loop runs and
    pass it as ``pool``. Raises ``ServeError`` when the workers are not ready
    within ``ready_timeout`` (the message names the last worker error).
    """
    # Remote workers: a lost node is noticed by missing heartbeats, so listen closely.
    cfg = config or ServerConfig(workers=workers, max_inflight=max(64, 8 * workers),
                                 heartbeat_timeout=2.0 if backend == "ray" else 5.0)
    pool = pool or make_pool(backend, ray_address=ray_address, worker_cpus=worker_cpus,
                             worker_resources=worker_resources)
    private = tempfile.mkdtemp(prefix="tw-env-")
    server = EnvServer(env, address=f"ipc://{private}/clients.sock", config=cfg,
                       factory=factory, options=options, pool=pool)
    try:
        await server.start()
    except BaseException:
        shutil.rmtree(private, ignore_errors=True)
        raise
    try:
        await server.wait_ready(timeout=ready_timeout)
        timeout = DEFAULT_TIMEOUT if client_timeout is None else client_timeout
        async with EnvClient(server.address, timeout=timeout) as client:
            yield client
    finally:
        await server.stop(drain=False, timeout=5.0)
        shutil.rmtree(private, ignore_errors=True)
