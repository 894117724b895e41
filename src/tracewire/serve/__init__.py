"""Env server: a ZMQ broker in front of worker processes that stream episodes turn by turn.

``EnvServer`` runs the broker and its workers; ``EnvClient`` asks for runs and assembles the
streamed deltas; ``WorkerPool`` is the one interface a worker backend implements (local
processes, inline tasks, or Ray actors via ``RayPool``); ``serve_env`` starts a server with
a backend and yields a connected client. The
wire protocol is described in :mod:`tracewire.serve._protocol`.
"""

from ._broker import EnvServer
from ._cli import COMMAND, RunnerOptions, serve_command
from ._client import DEFAULT_TIMEOUT, EnvClient
from ._config import DEFAULT_ADDRESS, ServerConfig
from ._open import WORKER_BACKENDS, WorkerBackend, make_pool, serve_env
from ._pool import InlinePool, LocalProcessPool, WorkerHandle, WorkerPool
from ._protocol import PROTOCOL_VERSION
from ._ray import RayPool
from ._requests import OnDelta, RunResult
from ._runner import (
    Runner,
    RunnerFactory,
    factory_ref,
    load_factory,
    standin_factory,
    standin_runner,
)

__all__ = [
    "COMMAND",
    "DEFAULT_ADDRESS",
    "DEFAULT_TIMEOUT",
    "PROTOCOL_VERSION",
    "WORKER_BACKENDS",
    "EnvClient",
    "EnvServer",
    "InlinePool",
    "LocalProcessPool",
    "OnDelta",
    "RayPool",
    "RunResult",
    "Runner",
    "RunnerFactory",
    "RunnerOptions",
    "ServerConfig",
    "WorkerBackend",
    "WorkerHandle",
    "WorkerPool",
    "factory_ref",
    "load_factory",
    "make_pool",
    "serve_command",
    "serve_env",
    "standin_factory",
    "standin_runner",
]

