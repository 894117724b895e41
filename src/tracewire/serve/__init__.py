"""Env server: a ZMQ broker in front of worker processes that stream episodes turn by turn.

``EnvServer`` runs the broker and its workers; ``EnvClient`` asks for runs and assembles the
streamed deltas; ``WorkerPool`` is the one interface a new worker backend implements. The
wire protocol is described in :mod:`tracewire.serve._protocol`.
"""

from ._broker import EnvServer
from ._client import DEFAULT_TIMEOUT, EnvClient, OnDelta, RunResult
from ._config import DEFAULT_ADDRESS, ServerConfig
from ._pool import InlinePool, LocalProcessPool, WorkerHandle, WorkerPool
from ._protocol import PROTOCOL_VERSION
from ._runner import Runner, RunnerFactory, load_factory, standin_factory, standin_runner

__all__ = [
    "DEFAULT_ADDRESS",
    "DEFAULT_TIMEOUT",
    "PROTOCOL_VERSION",
    "EnvClient",
    "EnvServer",
    "InlinePool",
    "LocalProcessPool",
    "OnDelta",
    "RunResult",
    "Runner",
    "RunnerFactory",
    "ServerConfig",
    "WorkerHandle",
    "WorkerPool",
    "load_factory",
    "standin_factory",
    "standin_runner",
]
