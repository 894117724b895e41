"""Ray worker backend: each worker is one async Ray actor running the ordinary worker loop.

Ray places the actors (spread over nodes, with the CPUs and custom resources asked for) and
restarts one whose process or node died (``max_restarts=-1``). It carries no episode data:
an actor's :meth:`RayWorker.serve` runs :func:`~tracewire.serve._worker.serve_worker`,
which connects to the broker's worker endpoint over ZMQ and streams deltas exactly as a
local worker process does, many episodes at once.

At most once: actor calls are never retried (``max_task_retries=0``), because a retried
``serve`` would replay model calls and tool side effects. When an actor dies, its pending
``serve`` call fails; its :class:`RayHandle` then reports the worker gone, the broker fails
that worker's in-flight episodes with ``WorkerDiedError`` and asks the pool for a new
worker, which is the restarted actor once Ray has brought it back (it registers with the
broker under a new worker id). Ray is imported on first use; without it the pool raises a
clear error naming the ``tracewire[ray]`` extra.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import re
import time
from typing import Any

import msgspec

from .._errors import ServeError
from ._config import WorkerConfig
from ._pool import WorkerHandle, WorkerPool

__all__ = ["RayHandle", "RayPool", "RayWorker", "import_ray"]

log = logging.getLogger("tracewire.serve")

_ANY_HOST = re.compile(r"tcp://(0\.0\.0\.0|\*|\[::\]):(\d+)")


def import_ray() -> Any:
    """Import Ray, or raise ``ServeError`` saying which extra to install."""
    try:
        return importlib.import_module("ray")
    except ImportError as exc:
        raise ServeError("the Ray worker backend needs Ray: install the extra "
                         "'tracewire[ray]' (pip install 'tracewire[ray]')") from exc


class RayWorker:
    """The body of one worker actor (wrapped with ``ray.remote`` by :class:`RayPool`)."""

    async def where(self) -> tuple[int, str, str]:
        """This actor's process id, node id and node address (answers once it is alive)."""
        ray = import_ray()
        ctx = ray.get_runtime_context()
        return os.getpid(), str(ctx.get_node_id()), str(ray.util.get_node_ip_address())

    async def serve(self, config_json: str) -> int:
        """Run one worker until the broker stops it; returns its exit status."""
        from .._memory import tune_allocator
        from ._worker import serve_worker  # the worker loop, as in a worker process

        cfg = msgspec.json.decode(config_json, type=WorkerConfig)
        tune_allocator()  # as a worker process does: reuse freed token memory, no page faults
        return await serve_worker(cfg)

    async def exit_now(self, status: int = 1) -> None:
        """End this actor's process at once, like a crash (fault injection; Ray restarts it)."""
        os._exit(status)


class RayHandle(WorkerHandle):
    """One worker: a ``serve`` call running on an actor of the pool."""

    def __init__(self, pool: RayPool, slot: int, ref: Any, where: tuple[int, str, str]) -> None:
        self._pool = pool
        self.slot = slot
        self.ref = ref
        self.pid, self.node_id, self.node_ip = where
        self.where = f"Ray actor {slot} on node {self.node_id[:8]} ({self.node_ip})"
        self._gone = asyncio.Event()

    async def wait(self) -> int:
        ray = self._pool.ray
        call = asyncio.ensure_future(self.ref)
        gone = asyncio.create_task(self._gone.wait())
        try:
            await asyncio.wait({call, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            self._pool.release(self.slot)
        if not call.done():
            # Killed by the broker: do not wait for Ray to confirm the death.
            call.add_done_callback(lambda f: f.cancelled() or f.exception())
            return -9
        try:
            return int(call.result())
        except ray.exceptions.RayActorError as exc:
            log.warning("%s died: %s", self.where, type(exc).__name__)
            return -9
        except (ray.exceptions.RayError, asyncio.CancelledError) as exc:
            log.warning("%s: serve call failed: %r", self.where, exc)
            return 1

    def kill(self) -> None:
        # The actor restarts (max_restarts=-1); its next use is a fresh worker.
        self._gone.set()
        with contextlib.suppress(Exception):
            self._pool.ray.kill(self._pool.actors[self.slot], no_restart=False)

    def terminate(self) -> None:
        self._gone.set()
        with contextlib.suppress(Exception):
            self._pool.ray.cancel(self.ref)


class RayPool(WorkerPool):
    """Starts workers as async Ray actors, spread over the cluster's nodes.

    ``address`` is given to ``ray.init`` when Ray is not initialised in this process yet
    (``"auto"``: the running cluster; ``"ray://host:port"``: Ray Client; ``"local"``: a new
    instance; None: this machine's instance, or a new one). Each actor asks for
    ``num_cpus`` CPUs and ``resources`` (e.g. ``{"env_node": 1}`` to keep workers on nodes
    that advertise it). With ``keep_actors``
    the actors outlive a server that used the pool, for the next one (tests, repeated evals).
    """

    same_host = False  # actors may run on other nodes: no loopback data path
    name = "ray"

    def __init__(self, *, address: str | None = None, num_cpus: float = 1.0,
                 resources: dict[str, float] | None = None, start_timeout: float = 120.0,
                 init_options: dict[str, Any] | None = None,
                 keep_actors: bool = False) -> None:
        self.address = address
        self.num_cpus = num_cpus
        self.resources = dict(resources or {})
        self.start_timeout = start_timeout
        self.init_options = dict(init_options or {})
        self.keep_actors = keep_actors
        self.actors: list[Any] = []
        self._busy: set[int] = set()
        self._cls: Any = None
        self.ray: Any = None

    def prepare(self) -> None:
        """Import Ray and join (or start) the cluster; blocking, so call it before serving."""
        if self.ray is not None:
            return
        ray = import_ray()
        if not ray.is_initialized():
            ray.init(address=self.address, **self.init_options)
        self._cls = ray.remote(RayWorker).options(
            max_restarts=-1, max_task_retries=0, num_cpus=self.num_cpus,
            resources=self.resources or None, scheduling_strategy="SPREAD")
        self.ray = ray

    def advertise(self, endpoint: str) -> str:
        """The worker endpoint as actors must dial it (a wildcard bind names this node)."""
        m = _ANY_HOST.fullmatch(endpoint)
        if m is None:
            return endpoint
        self.prepare()
        return f"tcp://{self.ray.util.get_node_ip_address()}:{m.group(2)}"

    def release(self, slot: int) -> None:
        """The worker on ``slot`` has ended; the actor may serve the next one."""
        self._busy.discard(slot)

    def _slot(self) -> int:
        for i in range(len(self.actors)):
            if i not in self._busy:
                self._busy.add(i)
                return i
        self.actors.append(self._cls.remote())
        self._busy.add(len(self.actors) - 1)
        return len(self.actors) - 1

    async def start(self, config: WorkerConfig) -> WorkerHandle:
        self.prepare()
        slot = self._slot()
        try:
            where = await self._alive(slot)
            cfg = msgspec.structs.replace(config, endpoint=self.advertise(config.endpoint))
            ref = self.actors[slot].serve.remote(msgspec.json.encode(cfg).decode())
        except BaseException:
            self.release(slot)
            raise
        return RayHandle(self, slot, ref, where)

    async def _alive(self, slot: int) -> tuple[int, str, str]:
        # An actor Ray is restarting refuses calls for a moment; asking where it runs is
        # side-effect free, so it may be repeated until the actor is back.
        ray, deadline = self.ray, time.monotonic() + self.start_timeout
        while True:
            try:
                pid, node, ip = await self.actors[slot].where.remote()
                return int(pid), str(node), str(ip)
            except ray.exceptions.RayError as exc:
                if time.monotonic() > deadline:
                    raise ServeError(f"Ray actor {slot} not alive after "
                                     f"{self.start_timeout}s: {exc}") from exc
                await asyncio.sleep(0.2)

    async def close(self) -> None:
        if self.ray is None or self.keep_actors:
            return
        for actor in self.actors:
            with contextlib.suppress(Exception):
                self.ray.kill(actor, no_restart=True)
        self.actors.clear()
        self._busy.clear()

    def alive(self) -> int:
        """Actors currently serving a worker (the broker's ready count is the honest one)."""
        return len(self._busy)
