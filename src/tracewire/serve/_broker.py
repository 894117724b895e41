"""The env server: a ROUTER broker in front of worker processes.

Clients talk to one ROUTER socket; workers connect (DEALER) to a second one. A request
becomes one job per episode; jobs wait in a bounded queue and go to the least-loaded ready
worker while fewer than ``max_inflight`` run. Worker output is routed by its 9-byte job frame
and forwarded to the client as it arrived (no decoding, no copy). Worker start, restart,
scaling, hang detection and timeouts live in :class:`~tracewire.serve._supervisor.Workers`.

Sockets bound on TCP are CURVE servers (``_auth``): each worker connects with a keypair made
for it alone and its messages are taken only when their CURVE user id is the worker id they
claim; clients connect with a key the server authorised (its client key file). Frames from
anyone else are dropped and counted (``frames_dropped``, ``*_handshakes_failed``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import struct
import tempfile
import time
from collections import deque
from typing import Any

import zmq

from .._errors import BusyError, ProtocolError, RunTimeout, ServeError, WorkerDiedError
from ..trace import SCHEMA_VERSION, new_id
from ._auth import ClientKey, is_tcp
from ._config import DEFAULT_ADDRESS, ServerConfig, WorkerConfig
from ._direct import loopback_id, valid_data_address
from ._guard import Guard
from ._io import Reader
from ._liveness import ClientWatch
from ._pool import LocalProcessPool, WorkerPool
from ._protocol import (
    PROTOCOL_VERSION,
    REQUESTS,
    JobKind,
    decode_envelope,
    encode_envelope,
    error_body,
    parse_job_frame,
)
from ._runner import RunnerFactory, factory_ref, standin_factory
from ._supervisor import Job, Workers, WorkerState

__all__ = ["EnvServer"]

log = logging.getLogger("tracewire.serve")

# What a socket monitor reports, and the events counted as a refused handshake.
_EVENT = struct.Struct("=HI")
_HANDSHAKE_FAILED = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                     | zmq.EVENT_HANDSHAKE_FAILED_AUTH)


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
        # Plain sockets driven by readers that drain each wake-up in one batch (see _io).
        self._ctx: zmq.Context[Any] = zmq.Context()
        self._front: zmq.Socket[Any] | None = None
        self._back: zmq.Socket[Any] | None = None
        self._readers: list[Reader] = []
        self._monitors: list[tuple[zmq.Socket[Any], zmq.Socket[Any]]] = []
        self._tmpdir: str | None = None
        self._guard = Guard(self._ctx)
        self.jobs: dict[int, Job] = {}
        self.queue: deque[Job] = deque()
        self.requests: dict[tuple[bytes, str], set[int]] = {}
        self.clients = ClientWatch(self.config.client_timeout)
        self.inflight = 0
        self.stopping = False
        self.started_at = 0.0
        self._next_job = 1
        self._tasks: list[asyncio.Task[None]] = []
        self._stopped = asyncio.Event()
        self.counters = {"runs": 0, "episodes_ok": 0, "episodes_failed": 0, "busy": 0,
                         "cancelled": 0, "timeouts": 0, "protocol_errors": 0,
                         "bytes_forwarded": 0, "clients_lost": 0, "workers_unresponsive": 0,
                         "frames_dropped": 0, "worker_handshakes_failed": 0,
                         "client_handshakes_failed": 0}
        self.workers = Workers(self, pool or LocalProcessPool())
        # Told to clients in `hello`, so they use the direct path only on a shared loopback.
        self._loopback = loopback_id() if self.workers.pool.same_host else None

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> EnvServer:
        """Bind, start the minimum number of workers and begin serving."""
        cfg = self.config
        # Joining a cluster blocks (Ray: seconds, once per process) and Ray wants the main
        # thread; callers that mind the stall call ``pool.prepare()`` before their loop.
        self.workers.pool.prepare()
        pool = self.workers.pool
        endpoint = cfg.worker_endpoint
        if pool.in_process:
            # In-process workers use inproc:// alone; nothing else may dial in.
            endpoint = f"inproc://tracewire-workers-{id(self):x}"
        elif endpoint is None and pool.same_host:
            self._tmpdir = tempfile.mkdtemp(prefix="tw-serve-")
            endpoint = f"ipc://{self._tmpdir}/workers.sock"
        elif endpoint is None:
            endpoint = "tcp://127.0.0.1:0"  # remote workers: loopback unless told otherwise
        curve_front = cfg.curve and is_tcp(self._bind)
        curve_workers = cfg.curve and is_tcp(endpoint)
        self._front = self._ctx.socket(zmq.ROUTER)
        self._front.setsockopt(zmq.LINGER, 1000)
        self._front.setsockopt(zmq.MAXMSGSIZE, cfg.max_request_bytes)
        # Sends to a gone or non-reading peer fail loudly instead of vanishing.
        self._front.setsockopt(zmq.ROUTER_MANDATORY, 1)
        if curve_front:
            self._guard.arm(self._front, workers=False)
        try:
            self._front.bind(self._bind)
        except zmq.ZMQError as exc:
            self._front.close(0)
            self._guard.close()
            raise ServeError(f"cannot bind {self._bind}: {exc}") from exc
        self.address = str(self._front.getsockopt_string(zmq.LAST_ENDPOINT))
        self._back = self._ctx.socket(zmq.ROUTER)
        self._back.setsockopt(zmq.LINGER, 0)
        self._back.setsockopt(zmq.ROUTER_MANDATORY, 1)
        if curve_workers:
            self._guard.arm(self._back, workers=True)
        try:
            self._back.bind(endpoint)
        except zmq.ZMQError as exc:
            self._front.close(0)
            self._back.close(0)
            self._guard.close()
            raise ServeError(f"cannot bind the worker endpoint {endpoint}: {exc}") from exc
        self.worker_endpoint = str(self._back.getsockopt_string(zmq.LAST_ENDPOINT))
        if pool.in_process:
            pool.attach(self._ctx, self.worker_endpoint)
        if curve_front:
            self._guard.admit_clients(self.address, cfg.client_key_file, cfg.client_keys)
        self.started_at = time.time()
        self._front_io = Reader(self._front, self._on_front, "clients")
        self._back_io = Reader(self._back, self._on_worker, "workers")
        self._readers = [self._front_io, self._back_io]
        # A worker's connection closing (its process or node gone) is heard at once; the
        # heartbeat timeout stays the backstop for peers that vanish without closing.
        self._watch(self._back, zmq.EVENT_DISCONNECTED | _HANDSHAKE_FAILED, "worker")
        if curve_front:
            self._watch(self._front, _HANDSHAKE_FAILED, "client")
        for r in self._readers:
            r.start()
        self._tasks = [asyncio.create_task(self._supervise(), name="serve-supervise")]
        self.workers.ensure()
        return self

    def _watch(self, sock: zmq.Socket[Any], events: int, who: str) -> None:
        monitor = sock.get_monitor_socket(events)
        self._monitors.append((sock, monitor))
        self._readers.append(Reader(monitor, lambda frames: self._on_event(who, frames),
                                    f"{who}-monitor"))

    def _on_event(self, who: str, frames: list[Any]) -> None:
        event, _ = _EVENT.unpack_from(frames[0].buffer)
        if event & _HANDSHAKE_FAILED:
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
        while self.workers.count("ready") < want:
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
        for job in list(self.queue):
            self.fail_job(job, ServeError("server shut down before the run started"))
        if drain:
            deadline = time.monotonic() + timeout
            while self.inflight and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
        for job in list(self.jobs.values()):
            self.fail_job(job, ServeError("server shut down before the run finished"))
        await self.workers.stop_all()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.sleep(0.05)  # let the last answers leave the socket
        for r in self._readers:
            r.stop()
        for sock, monitor in self._monitors:
            sock.disable_monitor()
            monitor.close(linger=0)
        for s in (self._front, self._back):
            if s is not None:
                s.close(linger=1000)
        self._guard.close()
        self._ctx.term()
        if self._tmpdir:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
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
            self._back_io.send([w.id.encode(), encode_envelope("probe", "")])
        except zmq.ZMQError as exc:
            return exc.errno != zmq.EHOSTUNREACH  # a full queue is a slow worker, not a gone one
        return True

    # -- jobs ------------------------------------------------------------------------------
    def fail_job(self, job: Job, exc: Exception) -> None:
        """Tell the client ``job`` failed (once) and stop it wherever it is."""
        if job.open:
            job.open = False
            self.counters["episodes_failed"] += 1
            self.answer(job.client, "error", job.rid, error_body(exc, i=job.index))
        if job.worker is None:
            with contextlib.suppress(ValueError):
                self.queue.remove(job)
            self.release(job)
        else:
            w = self.workers.get(job.worker)
            if w is None or w.state == "dead" or not self.to_worker(w, "cancel", {"job": job.id}):
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
            w = self.workers.get(job.worker)
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
        dispatched = False
        while self.queue and self.inflight < self.config.max_inflight and not self.stopping:
            w = self.workers.least_loaded()
            if w is None:
                break
            job = self.queue.popleft()
            body = {**job.body, "job": job.id, "index": job.index}
            if not self.to_worker(w, "run", body, job.rid):
                self.queue.appendleft(job)
                self.workers.kill(w, "does not accept work")
                break
            job.worker = w.id
            job.deadline = time.monotonic() + self.config.run_timeout
            w.jobs.add(job.id)
            self.inflight += 1
            dispatched = True
        if dispatched or self.queue:
            # Only then can more workers be wanted (the supervisor keeps the minimum).
            self.workers.ensure()

    def expire(self, now: float) -> None:
        """Fail jobs past their queue wait or run deadline."""
        cfg = self.config
        while self.queue and self.queue[0].queued_at + cfg.queue_timeout < now:
            job = self.queue[0]
            self.counters["busy"] += 1
            self.fail_job(job, BusyError(f"no free worker within {cfg.queue_timeout}s "
                                         f"({self.inflight} runs in flight)"))
        lost = self.clients.lost(now) if len(self.clients) else set()
        for job in list(self.jobs.values()):
            if job.open and job.client in lost:
                self.counters["clients_lost"] += 1
                self.fail_job(job, ServeError("the client stopped sending heartbeats"))
            elif job.open and job.deadline is not None and job.deadline < now:
                self.counters["timeouts"] += 1
                self.fail_job(job, RunTimeout(f"run exceeded the server's run timeout of "
                                              f"{cfg.run_timeout}s"))
            elif job.kill_at is not None and job.kill_at < now and job.worker is not None:
                w = self.workers.get(job.worker)
                job.kill_at = None
                if w is not None:
                    self.counters["workers_unresponsive"] += 1
                    self.workers.kill(w, f"did not stop a cancelled episode within "
                                         f"{cfg.cancel_grace}s")
        if len(self.clients):
            self.clients.keep_only({j.client for j in self.jobs.values()})

    async def _supervise(self) -> None:
        """Every 50 ms: job deadlines, then the worker manager's own checks."""
        while True:
            await asyncio.sleep(0.05)
            now = time.monotonic()
            self.expire(now)
            self.workers.check(now)

    # -- what the worker manager needs (the Broker protocol of _supervisor) ----------------
    def waiting(self) -> int:
        """Episodes queued for want of a free worker."""
        return len(self.queue)

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
        self.pump()

    def worker_gone(self, w: WorkerState, status: int) -> None:
        """Fail every job of a worker that exited (called within ms of its death noticed)."""
        self._guard.forget_worker(w.public_key)  # nobody reconnects as it
        where = f"pid {w.pid}" if w.pid is not None else (w.where or "no pid")
        for jid in list(w.jobs):
            job = self.jobs.get(jid)
            if job is None:
                continue
            self.fail_job(job, WorkerDiedError(
                f"worker {w.id} ({where}) exited with status {status} while running "
                f"this episode; it is being replaced"))
            self.release(job)
        self.pump()

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
            self.answer(client, "error", getattr(exc, "rid", ""), error_body(exc))
            return
        rid, body = env.rid, env.body
        if env.kind == "hb":
            return  # a sign of life, already noted; never answered
        if env.kind == "hello":
            self.answer(client, "reply", rid, {"proto": PROTOCOL_VERSION, "schema": SCHEMA_VERSION,
                                               "env": self.env, "loopback": self._loopback})
        elif env.kind == "health":
            self.answer(client, "reply", rid, self.health())
        elif env.kind == "stats":
            self.answer(client, "reply", rid, self.stats())
        elif env.kind == "cancel":
            self.answer(client, "reply", rid, {"cancelled": self._cancel(client, body)})
        else:
            self._submit(client, rid, env.kind, body)

    def _cancel(self, client: bytes, body: dict[str, Any]) -> int:
        target = str(body.get("target", ""))
        ids = list(self.requests.get((client, target), ()))
        for jid in ids:
            job = self.jobs.get(jid)
            if job is not None and job.open:
                self.counters["cancelled"] += 1
                self.fail_job(job, ServeError(f"run {target} was cancelled by the client"))
        return len(ids)

    def _submit(self, client: bytes, rid: str, kind: str, body: dict[str, Any]) -> None:
        cfg = self.config
        task = body.get("task")
        r = body.get("r", 1) if kind == "run_group" else 1
        if not isinstance(task, dict) or not isinstance(r, int) or not 1 <= r <= cfg.max_group:
            self.counters["protocol_errors"] += 1
            self.answer(client, "error", rid, error_body(ProtocolError(
                f"{kind} needs a task map and 1 <= r <= {cfg.max_group}")))
            return
        data = body.get("data")
        if data is not None and not valid_data_address(data):
            self.counters["protocol_errors"] += 1
            self.answer(client, "error", rid, error_body(ProtocolError(
                f"data address {data!r} is not a loopback tcp:// or an ipc:// address")))
            return
        if self.stopping:
            self.answer(client, "error", rid, error_body(ServeError("server is shutting down")))
            return
        if (client, rid) in self.requests:
            self.answer(client, "error", rid, error_body(ProtocolError(
                f"request id {rid!r} is already in use")))
            return
        assert cfg.max_queue is not None
        if len(self.queue) + r > cfg.max_queue or (
                r > cfg.max_inflight - self.inflight + cfg.max_queue - len(self.queue)):
            self.counters["busy"] += 1
            self.answer(client, "error", rid, error_body(BusyError(
                f"server busy: {self.inflight} runs in flight (max {cfg.max_inflight}), "
                f"{len(self.queue)} queued (max {cfg.max_queue})")))
            return
        self.counters["runs"] += 1
        group_id = (body.get("group_id") or new_id()) if kind == "run_group" else None
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
        ids = self.requests.setdefault((client, rid), set())
        for i in range(r):
            job = Job(id=self._next_job, client=client, rid=rid, index=i, body=job_body,
                      queued_at=now)
            self._next_job += 1
            self.jobs[job.id] = job
            ids.add(job.id)
            self.queue.append(job)
        self.pump()

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
        job = self.jobs.get(jid)
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
                self.fail_job(job, ServeError("client is not reading its stream"))
        if kind != JobKind.DELTA:
            self.release(job)

    # -- introspection ---------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        """Honest health: unhealthy when no worker is alive or the server is stopping."""
        live = self.workers.count("ready")
        return {
            "healthy": live > 0 and not self.stopping,
            "workers_live": live,
            "workers_total": len(self.workers.all),
            "workers_starting": self.workers.count("starting"),
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
