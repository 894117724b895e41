"""The env server: a ROUTER broker in front of worker processes.

Clients talk to one ROUTER socket; workers connect (DEALER) to a second one. A request
becomes one job per episode (queued, dispatched and failed by :class:`~._jobs.Dispatcher`).
Worker output is routed by its 9-byte job frame and forwarded to the client as it arrived (no
decoding, no copy). Worker start, restart, scaling, hang detection and timeouts live in
:class:`~tracewire.serve._supervisor.Workers`; the sockets themselves in ``_sockets``.

Sockets bound on TCP are CURVE servers (``_auth``): each worker connects with a keypair made
for it alone and its messages are taken only when their CURVE user id is the worker id they
claim; clients connect with a key the server authorised (its client key file). Frames from
anyone else are dropped and counted (``frames_dropped``, ``*_handshakes_failed``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import deque
from typing import Any

import zmq

from .._errors import BusyError, ProtocolError, ServeError
from ..trace import SCHEMA_VERSION, new_id
from ._auth import ClientKey
from ._config import DEFAULT_ADDRESS, ServerConfig, WorkerConfig
from ._direct import loopback_id, valid_data_address
from ._jobs import Dispatcher
from ._liveness import ClientWatch
from ._pool import LocalProcessPool, WorkerPool
from ._protocol import (
    PROTOCOL_VERSION,
    REQUESTS,
    JobKind,
    Kind,
    decode_envelope,
    encode_envelope,
    error_body,
    parse_job_frame,
)
from ._runner import RunnerFactory, factory_ref, standin_factory
from ._sockets import HANDSHAKE_FAILED, BrokerSockets, monitor_event
from ._supervisor import Job, WorkerPhase, Workers, WorkerState

__all__ = ["EnvServer"]

log = logging.getLogger("tracewire.serve")


class EnvServer:
    """Serves rollouts of environment ``env`` over ZMQ from a pool of worker processes.

    ``factory`` is the runner factory workers use, a module-level function or its
    ``"module:attribute"`` name (default: the stand-in runner for ``env == "standin"``; any
    other env needs one, e.g. ``tracewire.compose.env_factory``); ``options`` go to it.
    """

    def __init__(self, env: str, *, address: str = DEFAULT_ADDRESS,
                 config: ServerConfig | None = None,
                 factory: RunnerFactory | str | None = None,
                 options: dict[str, Any] | None = None, pool: WorkerPool | None = None) -> None:
        self.env = env
        self.config = config or ServerConfig()
        if factory is None and env != "standin":
            raise ServeError(f"environment {env!r} needs a runner factory (the composition "
                             "root's env_factory runs tracewire.env environments)")
        # Workers in other processes load the factory by this name.
        self.factory = factory_ref(factory or standin_factory)
        self.options = dict(options or {})
        self._bind = address
        self.address = address
        self._sockets = BrokerSockets()
        self._guard = self._sockets.guard
        self.clients = ClientWatch(self.config.client_timeout)
        self.stopping = False
        self.started_at = 0.0
        self._tasks: list[asyncio.Task[None]] = []
        self._stopped = asyncio.Event()
        self.counters = {"runs": 0, "episodes_ok": 0, "episodes_failed": 0, "busy": 0,
                         "cancelled": 0, "timeouts": 0, "protocol_errors": 0,
                         "bytes_forwarded": 0, "clients_lost": 0, "workers_unresponsive": 0,
                         "frames_dropped": 0, "worker_handshakes_failed": 0,
                         "client_handshakes_failed": 0}
        self.workers = Workers(self, pool or LocalProcessPool())
        self._jobs = Dispatcher(self)
        # Told to clients in `hello`, so they use the direct path only on a shared loopback.
        self._loopback = loopback_id() if self.workers.pool.same_host else None

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> EnvServer:
        """Bind, start the minimum number of workers and begin serving."""
        cfg = self.config
        # Joining a cluster blocks (Ray: seconds, once per process) and Ray wants the main
        # thread; callers that mind the stall call ``pool.prepare()`` before their loop.
        self.workers.pool.prepare()
        sockets = self._sockets
        sockets.bind(cfg, self._bind, self.workers.pool, f"{id(self):x}")
        self.address = sockets.address
        self.worker_endpoint = sockets.worker_endpoint
        self.started_at = time.time()
        sockets.serve(self._on_front, self._on_worker, self._on_event)
        self._front_io, self._back_io = sockets.front_io, sockets.back_io
        self._tasks = [asyncio.create_task(self._supervise(), name="serve-supervise")]
        self.workers.ensure()
        return self

    def _on_event(self, who: str, frames: list[Any]) -> None:
        event = monitor_event(frames)
        if event & HANDSHAKE_FAILED:
            self.counters[f"{who}_handshakes_failed"] += 1
        elif who == "worker" and event == zmq.EVENT_DISCONNECTED:
            self.workers.probe()

    @property
    def client_key_file(self) -> str | None:
        """The client key file of a CURVE client socket (None on ipc:// or inproc://)."""
        return self._guard.client_key_file

    @property
    def client_key(self) -> ClientKey | None:
        """What a client needs to connect (the key file's content), if CURVE is on."""
        return self._guard.client_key

    async def __aenter__(self) -> EnvServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def wait_ready(self, n: int | None = None, timeout: float = 60.0) -> None:
        """Wait until ``n`` (default: the minimum) workers are ready; ``ServeError`` if not."""
        want = self.config.workers if n is None else n
        deadline = time.monotonic() + timeout
        while self.workers.count(WorkerPhase.READY) < want:
            if time.monotonic() > deadline:
                raise ServeError(f"{want} workers not ready after {timeout}s "
                                 f"(last worker error: {self.workers.last_error})")
            await asyncio.sleep(0.02)

    async def serve_forever(self) -> None:
        """Wait until :meth:`stop` has completed."""
        await self._stopped.wait()

    async def stop(self, *, drain: bool = True, timeout: float = 30.0) -> None:
        """Refuse new work, drain in-flight runs (up to ``timeout``), fail the rest, stop."""
        if self.stopping:
            await self._stopped.wait()
            return
        self.stopping = True
        jobs = self._jobs
        for job in list(jobs.queue):
            jobs.fail(job, ServeError("server shut down before the run started"))
        if drain:
            deadline = time.monotonic() + timeout
            while jobs.inflight and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
        for job in list(jobs.jobs.values()):
            jobs.fail(job, ServeError("server shut down before the run finished"))
        await self.workers.stop_all()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.sleep(0.05)  # let the last answers leave the socket
        self._sockets.close()
        self._stopped.set()

    # -- sending ---------------------------------------------------------------------------
    def to_client(self, client: bytes, frames: list[Any]) -> bool:
        """Send to a client without waiting; False if it cannot take it (gone or not reading)."""
        try:
            self._front_io.send([client, *frames])
            return True
        except zmq.ZMQError as exc:
            log.warning("cannot send to client %s: %s", client.hex(), exc)
            return False

    def answer(self, client: bytes, kind: str, rid: str, body: dict[str, Any]) -> None:
        self.to_client(client, [encode_envelope(kind, rid, body)])

    def to_worker(self, w: WorkerState, kind: str, body: dict[str, Any], rid: str = "") -> bool:
        try:
            self._back_io.send([w.id.encode(), encode_envelope(kind, rid, body)])
            return True
        except zmq.ZMQError as exc:
            log.warning("cannot send to worker %s: %s", w.id, exc)
            return False

    def reachable(self, w: WorkerState) -> bool:
        """False when the connection to ``w`` is gone (its process or node died)."""
        try:
            self._back_io.send([w.id.encode(), encode_envelope(Kind.PROBE, "")])
        except zmq.ZMQError as exc:
            return exc.errno != zmq.EHOSTUNREACH  # a full queue is a slow worker, not a gone one
        return True

    # -- jobs (see _jobs) ------------------------------------------------------------------
    @property
    def jobs(self) -> dict[int, Job]:
        """Jobs not yet finished, by id (queued or running)."""
        return self._jobs.jobs

    @property
    def queue(self) -> deque[Job]:
        """Jobs waiting for a free worker, oldest first."""
        return self._jobs.queue

    @property
    def inflight(self) -> int:
        """Jobs running on a worker."""
        return self._jobs.inflight

    async def _supervise(self) -> None:
        """Every 50 ms: job deadlines, then the worker manager's own checks."""
        while True:
            await asyncio.sleep(0.05)
            now = time.monotonic()
            self._jobs.expire(now)
            self.workers.check(now)

    # -- what the worker manager needs (the Broker protocol of _supervisor) ----------------
    def waiting(self) -> int:
        """Episodes queued for want of a free worker."""
        return len(self._jobs.queue)

    def worker_config(self, w: WorkerState) -> WorkerConfig:
        """The configuration (and keys) the new worker ``w`` starts with."""
        cfg = self.config
        # Its own pair: the broker admits exactly this worker under exactly this id.
        keys = self._guard.worker_keys(w.id)
        w.public_key = keys.get("public_key", "")
        return WorkerConfig(endpoint=self.worker_endpoint, worker_id=w.id, env=self.env,
                            factory=self.factory, options=self.options,
                            heartbeat_s=cfg.heartbeat_s, coalesce_s=cfg.coalesce_s, **keys)

    def worker_ready(self, w: WorkerState) -> None:
        """A worker takes work from now on: give it some."""
        self._jobs.pump()

    def worker_gone(self, w: WorkerState, status: int) -> None:
        """Fail every job of a worker that exited (called within ms of its death noticed)."""
        self._guard.forget_worker(w.public_key)  # nobody reconnects as it
        where = f"pid {w.pid}" if w.pid is not None else (w.where or "no pid")
        self._jobs.worker_gone(w, f"worker {w.id} ({where}) exited with status {status} while "
                                  f"running this episode; it is being replaced")

    # -- client requests -------------------------------------------------------------------
    def _on_front(self, frames: list[Any]) -> None:
        client = frames[0].bytes
        if len(self.clients):
            self.clients.saw(client, time.monotonic())
        self._on_request(client, frames[1:])

    def _on_request(self, client: bytes, frames: list[Any]) -> None:
        try:
            if len(frames) != 1:
                raise ProtocolError(f"a request is one envelope frame, got {len(frames)}")
            env = decode_envelope(frames[0].buffer)
            if env.kind not in REQUESTS:
                raise ProtocolError(f"unknown request kind {env.kind!r}")
        except ProtocolError as exc:
            self.counters["protocol_errors"] += 1
            self.answer(client, Kind.ERROR, getattr(exc, "rid", ""), error_body(exc))
            return
        rid, body = env.rid, env.body
        if env.kind == Kind.HB:
            return  # a sign of life, already noted; never answered
        if env.kind == Kind.HELLO:
            self.answer(client, Kind.REPLY, rid, {
                "proto": PROTOCOL_VERSION, "schema": SCHEMA_VERSION, "env": self.env,
                "loopback": self._loopback})
        elif env.kind == Kind.HEALTH:
            self.answer(client, Kind.REPLY, rid, self.health())
        elif env.kind == Kind.STATS:
            self.answer(client, Kind.REPLY, rid, self.stats())
        elif env.kind == Kind.CANCEL:
            target = str(body.get("target", ""))
            self.answer(client, Kind.REPLY, rid, {"cancelled": self._jobs.cancel(client, target)})
        else:
            self._submit(client, rid, env.kind, body)

    def _submit(self, client: bytes, rid: str, kind: str, body: dict[str, Any]) -> None:
        cfg = self.config
        task = body.get("task")
        r = body.get("r", 1) if kind == Kind.RUN_GROUP else 1
        if not isinstance(task, dict) or not isinstance(r, int) or not 1 <= r <= cfg.max_group:
            self.counters["protocol_errors"] += 1
            self.answer(client, Kind.ERROR, rid, error_body(ProtocolError(
                f"{kind} needs a task map and 1 <= r <= {cfg.max_group}")))
            return
        data = body.get("data")
        if data is not None and not valid_data_address(data):
            self.counters["protocol_errors"] += 1
            self.answer(client, Kind.ERROR, rid, error_body(ProtocolError(
                f"data address {data!r} is not a loopback tcp:// or an ipc:// address")))
            return
        if self.stopping:
            self.answer(client, Kind.ERROR, rid, error_body(ServeError("server is shutting down")))
            return
        jobs = self._jobs
        if (client, rid) in jobs.requests:
            self.answer(client, Kind.ERROR, rid, error_body(ProtocolError(
                f"request id {rid!r} is already in use")))
            return
        if not jobs.has_room(r):
            self.counters["busy"] += 1
            self.answer(client, Kind.ERROR, rid, error_body(BusyError(
                f"server busy: {jobs.inflight} runs in flight (max {cfg.max_inflight}), "
                f"{len(jobs.queue)} queued (max {cfg.max_queue})")))
            return
        self.counters["runs"] += 1
        group_id = (body.get("group_id") or new_id()) if kind == Kind.RUN_GROUP else None
        job_body = {"task": task, "group_id": group_id, "stream": bool(body.get("stream", True)),
                    "keep_frames": bool(body.get("keep_frames", False))}
        data_key = body.get("data_key")
        if data is not None and self.workers.pool.same_host and isinstance(data_key, str) \
                and len(data_key) == 32:
            job_body["data"] = data
            job_body["data_key"] = data_key
        now = time.monotonic()
        if "hb" in body:
            self.clients.promise(client, body["hb"], now)
        jobs.add(client, rid, r, job_body, now)

    # -- worker output ---------------------------------------------------------------------
    def _on_worker(self, frames: list[Any]) -> None:
        wid = frames[0].bytes.decode("utf-8", "replace")
        w = self.workers.get(wid)
        # On CURVE the user id is the id the gate gave this key: a worker speaks only as itself.
        if w is None or len(frames) < 3 or (
                self._guard.workers and frames[0].get("User-Id") != wid):
            self.counters["frames_dropped"] += 1
            return
        w.last_seen = time.monotonic()
        if not frames[1].buffer.nbytes:
            env = decode_envelope(frames[2].buffer)
            self.workers.control(w, env.kind, env.body)
            return
        jid, kind = parse_job_frame(frames[1].buffer)
        jobs = self._jobs
        job = jobs.jobs.get(jid)
        if job is None:
            return
        if kind == JobKind.DONE:
            # The worker answered the client directly (see _direct).
            if job.open:
                job.open = False
                self.counters["episodes_ok"] += 1
        elif job.open and kind != JobKind.CANCELLED:
            ok = self.to_client(job.client, frames[2:])
            self.counters["bytes_forwarded"] += sum(f.buffer.nbytes for f in frames[2:])
            if kind == JobKind.REPLY:
                job.open = False
                self.counters["episodes_ok" if ok else "episodes_failed"] += 1
            elif kind == JobKind.ERROR:
                job.open = False
                self.counters["episodes_failed"] += 1
            elif not ok:
                # The client cannot take the stream (gone, or not reading): stop the run.
                jobs.fail(job, ServeError("client is not reading its stream"))
        if kind != JobKind.DELTA:
            jobs.release(job)

    # -- introspection ---------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        """Honest health: unhealthy when no worker is alive or the server is stopping."""
        live = self.workers.count(WorkerPhase.READY)
        return {
            "healthy": live > 0 and not self.stopping,
            "workers_live": live,
            "workers_total": len(self.workers.all),
            "workers_starting": self.workers.count(WorkerPhase.STARTING),
            "inflight": self.inflight,
            "queued": len(self.queue),
            "max_inflight": self.config.max_inflight,
            "max_queue": self.config.max_queue,
            "stopping": self.stopping,
            "last_worker_error": self.workers.last_error,
            "env": self.env,
            "backend": self.workers.pool.name,
            "pid": os.getpid(),
            "curve": {"clients": self.client_key is not None, "workers": self._guard.workers},
        }

    def stats(self) -> dict[str, Any]:
        """Health plus counters and one row per worker."""
        return {
            **self.health(),
            **self.counters,
            "uptime_s": time.time() - self.started_at,
            "worker_starts": self.workers.starts,
            "worker_deaths": self.workers.deaths,
            "workers": [w.row() for w in self.workers.all.values()],
            "worker_endpoint": self.worker_endpoint,
            "handshakes_denied": self._guard.denied(),
        }
