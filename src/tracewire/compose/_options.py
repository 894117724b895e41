"""The options an eval's rollouts share, and the names of the backends that run them.

Kept apart from the backends themselves so the command line can list them without
importing the parts they wire.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from ..env import Timeouts

__all__ = ["BACKENDS", "DEFAULT_UPSTREAM_API", "ENGINES", "RUNTIMES", "UPSTREAM_APIS", "Backend",
           "RolloutPlan", "RuntimeName", "ServePlan"]



class Backend(StrEnum):
    """Where an eval's rollouts run: ``local`` is this process; ``process`` and ``ray`` are
    the workers of an env server (``serve.WorkerBackend``'s local processes or Ray actors)."""

    LOCAL = "local"
    PROCESS = "process"
    RAY = "ray"


#: Every :class:`Backend`, for the command line's choices.
BACKENDS: tuple[Backend, ...] = tuple(Backend)


class RuntimeName(StrEnum):
    """Where a command harness's agent runs (``tracewire eval --runtime``); resolved by
    ``_runtime.runtime_factory``, which imports the runtime part."""

    LOCAL = "local"
    BWRAP = "bwrap"
    DOCKER = "docker"


#: Every :class:`RuntimeName`, for the command line's choices.
RUNTIMES: tuple[RuntimeName, ...] = tuple(RuntimeName)
#: Token-in endpoints ``--upstream-api`` accepts: the values of ``tito.codecs.UpstreamApi``
#: (spelled here so the command line need not import tito; tests/test_commands.py pins it).
UPSTREAM_APIS = ("completions", "generate", "sglang", "llamacpp")
#: The token-in endpoint when none is named (vLLM ``/v1/completions``).
DEFAULT_UPSTREAM_API = UPSTREAM_APIS[0]

#: Local engines an eval can start (``tracewire eval --engine``); see ``_engine``.
ENGINES = ("llamacpp",)


@dataclass(frozen=True)
class RolloutPlan:
    """What every rollout of an eval shares: the model server, sampling and deadlines."""

    base_url: str | None = None
    model: str | None = None
    api_key: str | None = None
    seed: int = 0
    max_model_len: int | None = None
    sampling: Mapping[str, Any] = field(default_factory=dict)
    timeouts: Timeouts | None = None
    #: Token-in/token-out: a local tokenizer directory and the endpoint to send ids to
    #: (a ``tito.codecs.UpstreamApi`` value, see ``make_upstream``); None keeps the chat
    #: pass-through.
    tokenizer: str | None = None
    upstream_api: str = DEFAULT_UPSTREAM_API
    #: A local engine to start for the eval (one of ``ENGINES``) on ``engine_model`` (a GGUF
    #: file; None: the bundled one) with ``engine_parallel`` slots; it replaces
    #: ``base_url`` and serves token-in/token-out with the GGUF as tokenizer.
    engine: str | None = None
    engine_model: str | None = None
    engine_parallel: int = 1


@dataclass(frozen=True)
class ServePlan:
    """How an env-server backend (``process``, ``ray``) runs: its workers, where Ray is,
    and the environment reference workers load (default: the environment's name)."""

    backend: str = "process"
    workers: int = 2
    concurrency: int = 8
    env_ref: str | None = None
    ray_address: str | None = None
    worker_cpus: float = 1.0
    worker_resources: Mapping[str, float] | None = None
    #: Where a command harness's agent runs in the workers (a runtime name), or None.
    runtime: str | None = None
    #: Host paths the workers' sandboxes bind read-only / put on their PATH (as in a
    #: local eval's ``ro_paths``/``sandbox_paths``).
    ro_paths: tuple[str, ...] = ()
    sandbox_paths: tuple[str, ...] = ()
    #: A worker pool built (and, for Ray, prepared) by the caller; overrides the above.
    pool: Any = None
