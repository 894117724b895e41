"""The broker's view of its workers: start, restart with back-off, scale, detect hangs.

A worker is ``starting`` until it says ``ready``, then ``ready`` (takes work), ``retiring``
(told to stop because idle) or ``killing`` (being killed: it gets no new job, since it will
not live to run it) and finally ``dead``. A death is noticed from the pool handle's
``wait()`` (milliseconds after the process exits) or from missing heartbeats (hung worker,
killed), or at once from its connection closing (a remote worker's process or node gone);
either way its in-flight jobs fail at once with ``WorkerDiedError``.

The manager sees its broker only through :class:`Broker` (how much work waits, how to talk
to a worker, what to do when one becomes ready or goes); queueing, dispatch and deadlines
stay the broker's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from ._config import ServerConfig, WorkerConfig
from ._pool import WorkerHandle, WorkerPool
from ._protocol import Kind

__all__ = ["Broker", "Job", "WorkerPhase", "WorkerState", "Workers"]

log = logging.getLogger("tracewire.serve")


@dataclass(eq=False)
class Job:
    """One episode requested by a client: queued, then running on one worker."""

    id: int
    client: bytes
    rid: str
    index: int
    body: dict[str, Any]
    queued_at: float
    worker: str | None = None
    deadline: float | None = None
    #: False once the client got its final answer (reply or error); later output is dropped.
    open: bool = True
    #: When a worker that was told to stop this job is taken as hung and killed.
    kill_at: float | None = None


class WorkerPhase(StrEnum):
    """Where a worker is in its life (``stats``' ``state`` of each worker row)."""

    STARTING = "starting"
    READY = "ready"
    #: Told to die for misbehaving; handed nothing new until its death is seen.
    KILLING = "killing"
    #: Told to stop (surplus or shutdown); its exit is not counted as a death.
    RETIRING = "retiring"
    DEAD = "dead"


@dataclass(eq=False)
class WorkerState:
    """What the broker knows about one worker."""

    id: str
    state: WorkerPhase = WorkerPhase.STARTING
    handle: WorkerHandle | None = None
    pid: int | None = None
    #: Where the worker runs when it is not a local process (e.g. a Ray actor and its node).
    where: str | None = None
    started: float = field(default_factory=time.monotonic)
    last_seen: float = field(default_factory=time.monotonic)
    idle_since: float = field(default_factory=time.monotonic)
    jobs: set[int] = field(default_factory=set)
    done: int = 0
    #: Its CURVE public key (Z85) on a TCP worker endpoint, else empty.
    public_key: str = ""
    #: When it was last told to die (a kill that did not take is repeated).
    killed_at: float = 0.0

    def row(self) -> dict[str, Any]:
        """A row for ``stats``."""
        return {"id": self.id, "state": self.state, "pid": self.pid, "where": self.where,
                "load": len(self.jobs),
                "done": self.done, "age_s": round(time.monotonic() - self.started, 3)}


class Broker(Protocol):
    """What :class:`Workers` needs from the broker it manages workers for."""

    config: ServerConfig
    stopping: bool

    def waiting(self) -> int:
        """Episodes queued for want of a free worker."""

    def worker_config(self, w: WorkerState) -> WorkerConfig:
        """The configuration (and keys) the new worker ``w`` starts with."""

    def to_worker(self, w: WorkerState, kind: str, body: dict[str, Any], rid: str = "") -> bool:
        """Send a control message to ``w``; False if it cannot take it."""

    def worker_ready(self, w: WorkerState) -> None:
        """``w`` takes work from now on."""

    def reachable(self, w: WorkerState) -> bool:
        """False when the connection to ``w`` is gone."""

    def worker_gone(self, w: WorkerState, status: int) -> None:
        """``w`` has exited (``status``): its in-flight episodes must fail."""


class Workers:
    """Keeps between ``workers`` and ``max_workers`` workers alive for one broker."""

    def __init__(self, server: Broker, pool: WorkerPool) -> None:
        self.server = server
        self.pool = pool
        self.all: dict[str, WorkerState] = {}
        self.starts = 0
        self.deaths = 0
        self.last_error: str | None = None
        self._n = 0
        self._failures = 0
        self._not_before = 0.0
        self._tasks: set[asyncio.Task[None]] = set()

    def get(self, wid: str) -> WorkerState | None:
        return self.all.get(wid)

    def count(self, state: WorkerPhase) -> int:
        return sum(1 for w in self.all.values() if w.state == state)

    def least_loaded(self) -> WorkerState | None:
        ready = [w for w in self.all.values() if w.state == WorkerPhase.READY]
        return min(ready, key=lambda w: len(w.jobs)) if ready else None

    # -- starting and stopping -------------------------------------------------------------
    def ensure(self) -> None:
        """Start workers up to the minimum, or one more when all are busy (scale up)."""
        srv, cfg = self.server, self.server.config
        if srv.stopping or time.monotonic() < self._not_before:
            return
        alive = [w for w in self.all.values()
                 if w.state in (WorkerPhase.STARTING, WorkerPhase.READY)]
        want = cfg.workers
        starting = any(w.state == WorkerPhase.STARTING for w in alive)
        assert cfg.slots_per_worker is not None and cfg.max_workers is not None
        ready = [w for w in alive if w.state == WorkerPhase.READY]
        saturated = bool(ready) and all(len(w.jobs) >= 0.9 * cfg.slots_per_worker for w in ready)
        if not starting and (srv.waiting() or saturated):
            want = max(want, len(alive) + 1)
        want = min(want, cfg.max_workers)
        for _ in range(want - len(alive)):
            self._spawn()

    def _spawn(self) -> None:
        self._n += 1
        # Unguessable: on a TCP endpoint the id is also the worker's CURVE user id.
        w = WorkerState(id=f"w{self._n}-{secrets.token_hex(8)}")
        self.all[w.id] = w
        t = asyncio.create_task(self._run(w), name=f"worker-{w.id}")
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    async def _run(self, w: WorkerState) -> None:
        cfg = self.server.worker_config(w)
        self.starts += 1
        try:
            w.handle = await self.pool.start(cfg)
        except Exception as exc:
            log.exception("cannot start worker %s", w.id)
            self._dead(w, None, f"cannot start worker: {exc}")
            return
        w.pid = w.handle.pid
        w.where = w.handle.where
        status = await w.handle.wait()
        self._dead(w, status, None)

    def _dead(self, w: WorkerState, status: int | None, why: str | None) -> None:
        was = w.state
        w.state = WorkerPhase.DEAD
        self.all.pop(w.id, None)
        if was != WorkerPhase.RETIRING:
            self.deaths += 1
            if why is None:
                why = f"worker {w.id} (pid {w.pid}) exited with status {status}"
                # Why it was killed (or failed to start) says more than its exit status.
                if was in (WorkerPhase.STARTING, WorkerPhase.KILLING) and self.last_error and \
                        w.id in self.last_error:
                    why = self.last_error
            self.last_error = why
            # Back off when workers die young (a crash loop), not after a long healthy life.
            young = time.monotonic() - w.started < 5.0
            self._failures = self._failures + 1 if young else 0
            if self._failures:
                self._not_before = time.monotonic() + min(5.0, 0.1 * 2 ** (self._failures - 1))
            log.warning("%s", why)
        self.server.worker_gone(w, -1 if status is None else status)

    def kill(self, w: WorkerState, reason: str) -> None:
        """Kill a worker that misbehaves; its death is then handled as any other."""
        self.last_error = f"worker {w.id} (pid {w.pid}) killed: {reason}"
        log.warning("%s", self.last_error)
        if w.state in (WorkerPhase.STARTING, WorkerPhase.READY):
            # Until its death is seen (a Ray kill takes a while) it is handed nothing new.
            w.state = WorkerPhase.KILLING
        w.killed_at = time.monotonic()
        if w.handle is not None:
            w.handle.kill()

    def control(self, w: WorkerState, kind: str, body: dict[str, Any]) -> None:
        """A control message from a worker: ``ready``, ``hb`` or ``fatal``."""
        if kind == Kind.READY and w.state == WorkerPhase.STARTING:
            w.state = WorkerPhase.READY
            w.idle_since = time.monotonic()
            self.server.worker_ready(w)
        elif kind == Kind.FATAL:
            self.last_error = (f"worker {w.id} failed to start: "
                               f"{body.get('type')}: {body.get('message')}")

    def probe(self) -> None:
        """Some worker's connection closed: kill (and so replace) the ready ones it was."""
        for w in [w for w in self.all.values() if w.state == WorkerPhase.READY]:
            if not self.server.reachable(w):
                self.kill(w, "its connection to the server closed")

    def check(self, now: float) -> None:
        """Kill hung or slow-starting workers, retire a surplus idle one, keep the minimum."""
        srv, cfg = self.server, self.server.config
        for w in list(self.all.values()):
            if w.state == WorkerPhase.READY and now - w.last_seen > cfg.heartbeat_timeout:
                self.kill(w, f"no heartbeat for {cfg.heartbeat_timeout}s")
            elif w.state == WorkerPhase.STARTING and now - w.started > cfg.start_timeout:
                self.kill(w, f"not ready after {cfg.start_timeout}s")
            elif w.state == WorkerPhase.KILLING and now - w.killed_at > cfg.cancel_grace:
                # A kill that did not take is repeated (the first reason stays the error).
                w.killed_at = now
                if w.handle is not None:
                    w.handle.kill()
        ready = [w for w in self.all.values() if w.state == WorkerPhase.READY]
        idle = [w for w in ready if not w.jobs and now - w.idle_since > cfg.idle_s]
        load = sum(len(w.jobs) for w in ready)
        assert cfg.slots_per_worker is not None
        # Retire only if the others would not be saturated (else we would start anew).
        if (idle and not srv.waiting() and len(ready) > cfg.workers
                and load < 0.9 * cfg.slots_per_worker * (len(ready) - 1)):
            w = idle[0]
            w.state = WorkerPhase.RETIRING
            srv.to_worker(w, Kind.STOP, {})
        self.ensure()

    async def stop_all(self, timeout: float = 5.0) -> None:
        """Tell every worker to stop; kill those still running after ``timeout``."""
        for w in list(self.all.values()):
            was, w.state = w.state, WorkerPhase.RETIRING
            told = was != WorkerPhase.STARTING and self.server.to_worker(w, Kind.STOP, {})
            if not told and w.handle is not None:
                w.handle.terminate()
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=timeout)
            for w in list(self.all.values()):
                if w.handle is not None:
                    w.handle.kill()
            if pending:
                await asyncio.wait(pending, timeout=2.0)
        with contextlib.suppress(Exception):
            await self.pool.close()
