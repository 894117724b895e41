"""The broker's jobs: one per episode, queued (bounded), dispatched, timed out and failed.

Jobs wait in FIFO order and go to the least-loaded ready worker while fewer than
``max_inflight`` run. A job fails at most once towards its client (an ``error`` envelope);
failing a running job also cancels it on its worker, which is killed if it does not stop
within ``cancel_grace``.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from typing import Any, Protocol

from .._errors import BusyError, RunTimeout, ServeError, WorkerDiedError
from ._config import ServerConfig
from ._liveness import ClientWatch
from ._protocol import Kind, error_body
from ._supervisor import Job, WorkerPhase, Workers, WorkerState

__all__ = ["Dispatcher", "JobHost"]


class JobHost(Protocol):
    """What :class:`Dispatcher` needs from its broker."""

    config: ServerConfig
    stopping: bool
    counters: dict[str, int]
    workers: Workers
    clients: ClientWatch

    def answer(self, client: bytes, kind: str, rid: str, body: dict[str, Any]) -> None:
        """Send one envelope to ``client``."""

    def to_worker(self, w: WorkerState, kind: str, body: dict[str, Any], rid: str = "") -> bool:
        """Send one envelope to ``w``; False if it cannot take it."""


class Dispatcher:
    """The job table, the queue and the in-flight count of one broker."""

    def __init__(self, host: JobHost) -> None:
        self.host = host
        self.config = host.config
        self.counters = host.counters
        self.jobs: dict[int, Job] = {}
        self.queue: deque[Job] = deque()
        #: (client, request id) -> ids of that request's jobs (a group has several).
        self.requests: dict[tuple[bytes, str], set[int]] = {}
        self.inflight = 0
        self._next_job = 1

    def has_room(self, r: int) -> bool:
        """Whether ``r`` more episodes fit in the queue and the free slots."""
        cfg = self.config
        assert cfg.max_queue is not None
        return not (len(self.queue) + r > cfg.max_queue or (
            r > cfg.max_inflight - self.inflight + cfg.max_queue - len(self.queue)))

    def add(self, client: bytes, rid: str, r: int, body: dict[str, Any], now: float) -> None:
        """Queue ``r`` jobs of one request (indexes 0..r-1) and dispatch what can run."""
        ids = self.requests.setdefault((client, rid), set())
        for i in range(r):
            job = Job(id=self._next_job, client=client, rid=rid, index=i, body=body,
                      queued_at=now)
            self._next_job += 1
            self.jobs[job.id] = job
            ids.add(job.id)
            self.queue.append(job)
        self.pump()

    def cancel(self, client: bytes, target: str) -> int:
        """Fail every open job of request ``target``; returns how many jobs it had."""
        ids = list(self.requests.get((client, target), ()))
        for jid in ids:
            job = self.jobs.get(jid)
            if job is not None and job.open:
                self.counters["cancelled"] += 1
                self.fail(job, ServeError(f"run {target} was cancelled by the client"))
        return len(ids)

    def fail(self, job: Job, exc: Exception) -> None:
        """Tell the client ``job`` failed (once) and stop it wherever it is."""
        if job.open:
            job.open = False
            self.counters["episodes_failed"] += 1
            self.host.answer(job.client, Kind.ERROR, job.rid, error_body(exc, i=job.index))
        if job.worker is None:
            with contextlib.suppress(ValueError):
                self.queue.remove(job)
            self.release(job)
        else:
            w = self.host.workers.get(job.worker)
            if w is None or w.state == WorkerPhase.DEAD or not self.host.to_worker(
                    w, Kind.CANCEL, {"job": job.id}):
                self.release(job)
            elif job.kill_at is None:
                # A worker that does not stop the episode is hung: it is killed then.
                job.kill_at = time.monotonic() + self.config.cancel_grace

    def release(self, job: Job) -> None:
        """Forget a finished job and free its slot."""
        if self.jobs.pop(job.id, None) is None:
            return
        if job.worker is not None:
            self.inflight -= 1
            w = self.host.workers.get(job.worker)
            if w is not None:
                w.jobs.discard(job.id)
                w.done += 1
                w.idle_since = time.monotonic()
        key = (job.client, job.rid)
        ids = self.requests.get(key)
        if ids is not None:
            ids.discard(job.id)
            if not ids:
                del self.requests[key]
        self.pump()

    def pump(self) -> None:
        """Dispatch queued jobs to the least-loaded ready workers while slots are free."""
        host, workers = self.host, self.host.workers
        dispatched = False
        while self.queue and self.inflight < self.config.max_inflight and not host.stopping:
            w = workers.least_loaded()
            if w is None:
                break
            job = self.queue.popleft()
            body = {**job.body, "job": job.id, "index": job.index}
            if not host.to_worker(w, Kind.RUN, body, job.rid):
                self.queue.appendleft(job)
                workers.kill(w, "does not accept work")
                break
            job.worker = w.id
            job.deadline = time.monotonic() + self.config.run_timeout
            w.jobs.add(job.id)
            self.inflight += 1
            dispatched = True
        if dispatched or self.queue:
            # Only then can more workers be wanted (the supervisor keeps the minimum).
            workers.ensure()

    def expire(self, now: float) -> None:
        """Fail jobs past their queue wait or run deadline, or whose client went silent;
        kill the worker of a cancelled job it did not stop in time."""
        cfg, clients = self.config, self.host.clients
        while self.queue and self.queue[0].queued_at + cfg.queue_timeout < now:
            job = self.queue[0]
            self.counters["busy"] += 1
            self.fail(job, BusyError(f"no free worker within {cfg.queue_timeout}s "
                                     f"({self.inflight} runs in flight)"))
        lost = clients.lost(now) if len(clients) else set()
        for job in list(self.jobs.values()):
            if job.open and job.client in lost:
                self.counters["clients_lost"] += 1
                self.fail(job, ServeError("the client stopped sending heartbeats"))
            elif job.open and job.deadline is not None and job.deadline < now:
                self.counters["timeouts"] += 1
                self.fail(job, RunTimeout(f"run exceeded the server's run timeout of "
                                          f"{cfg.run_timeout}s"))
            elif job.kill_at is not None and job.kill_at < now and job.worker is not None:
                w = self.host.workers.get(job.worker)
                job.kill_at = None
                if w is not None:
                    self.counters["workers_unresponsive"] += 1
                    self.host.workers.kill(w, f"did not stop a cancelled episode within "
                                              f"{cfg.cancel_grace}s")
        if len(clients):
            clients.keep_only({j.client for j in self.jobs.values()})

    def worker_gone(self, w: WorkerState, message: str) -> None:
        """Fail (with ``message``) and forget every job of a worker that exited."""
        for jid in list(w.jobs):
            job = self.jobs.get(jid)
            if job is None:
                continue
            self.fail(job, WorkerDiedError(message))
            self.release(job)
        self.pump()

