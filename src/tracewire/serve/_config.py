"""Settings of the env server, all with finite defaults."""

from __future__ import annotations

import math
from typing import Any

import msgspec
from zmq.utils import z85

__all__ = ["DEFAULT_ADDRESS", "ServerConfig", "WorkerConfig"]

#: Loopback by default; binding elsewhere must be asked for explicitly.
DEFAULT_ADDRESS = "tcp://127.0.0.1:5555"


class ServerConfig(msgspec.Struct, kw_only=True):
    """Pool size, bounds and timeouts of an :class:`~tracewire.serve.EnvServer`.

    ``workers`` is the minimum number of workers kept alive, ``max_workers`` the most the
    broker scales up to under load (default: ``workers``). At most ``max_inflight`` episodes
    run at once; up to ``max_queue`` more wait, each at most ``queue_timeout`` seconds, and
    anything beyond is refused with ``BusyError``. A run (one episode) gets ``run_timeout``
    seconds once it started.
    """

    workers: int = 1
    max_workers: int | None = None
    max_inflight: int = 64
    max_queue: int | None = None
    run_timeout: float = 600.0
    queue_timeout: float = 60.0
    #: Episodes a worker should hold before another worker is started (default: even share).
    slots_per_worker: int | None = None
    #: A worker with no work for this long is stopped while more than ``workers`` live.
    idle_s: float = 30.0
    heartbeat_s: float = 0.25
    #: A worker silent for this long is considered hung and killed.
    heartbeat_timeout: float = 5.0
    #: A worker that has not stopped a cancelled or timed-out episode this long after being
    #: told is taken as hung and killed (its pool restarts it).
    cancel_grace: float = 5.0
    #: Least silence after which a client that promised heartbeats is taken as gone and
    #: its runs are cancelled (see ``_liveness``).
    client_timeout: float = 2.0
    #: A worker not ready after this long is killed (its factory may load a model).
    start_timeout: float = 120.0
    #: Largest request a client may send (the task rides in it).
    max_request_bytes: int = 16 << 20
    max_group: int = 1024
    #: Minimum time between two deltas of one episode (bursts coalesce).
    coalesce_s: float = 0.002
    #: Endpoint workers connect to; default: an ipc socket in a private temp directory.
    worker_endpoint: str | None = None
    #: Encrypt and authenticate with ZMQ CURVE every socket of the server bound on TCP
    #: (docs/CLUSTER.md); off only to measure what it costs, or on a network you trust.
    curve: bool = True
    #: Where a CURVE server writes its client key file (default: a private temp directory).
    client_key_file: str | None = None
    #: Further client public keys (Z85) the server lets in, besides its own key file's.
    client_keys: list[str] = msgspec.field(default_factory=list)

    def __post_init__(self) -> None:
        if self.workers < 0 or self.max_inflight < 1:
            raise ValueError("workers must be >= 0 and max_inflight >= 1")
        if self.max_workers is None:
            self.max_workers = max(self.workers, 1)
        if self.max_workers < max(self.workers, 1):
            raise ValueError("max_workers must be >= workers")
        if self.max_queue is None:
            self.max_queue = 4 * self.max_inflight
        if self.slots_per_worker is None:
            self.slots_per_worker = max(1, math.ceil(self.max_inflight / self.max_workers))
        for key in self.client_keys:
            try:
                ok = len(z85.decode(key)) == 32
            except (ValueError, TypeError):
                ok = False
            if not ok:
                raise ValueError(f"client key {key!r} is not a Z85 CURVE public key")
        for name in ("run_timeout", "queue_timeout", "heartbeat_timeout", "start_timeout",
                     "cancel_grace", "client_timeout"):
            v = getattr(self, name)
            if not (v > 0 and math.isfinite(v)):
                raise ValueError(f"{name} must be a positive finite number of seconds")


class WorkerConfig(msgspec.Struct, kw_only=True):
    """What a worker needs to know; it holds secrets, so never on argv or in the environment.

    A worker process reads it as JSON on its standard input (a pipe only it and the broker
    hold); a Ray actor gets it as a call argument.
    """

    endpoint: str
    worker_id: str
    env: str
    factory: str
    options: dict[str, Any] = msgspec.field(default_factory=dict)
    heartbeat_s: float = 0.25
    coalesce_s: float = 0.002
    #: CURVE keys (Z85) on a TCP endpoint: the broker's public key and this worker's own
    #: pair, made for it alone; empty on ipc:// and inproc:// endpoints.
    server_key: str = ""
    public_key: str = ""
    secret_key: str = ""
