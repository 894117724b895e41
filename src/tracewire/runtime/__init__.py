"""Where an agent program runs: ``local`` (a host subprocess, unsafe for untrusted
agents), ``bwrap`` (a bubblewrap sandbox whose only way out is its proxy session) and
``docker`` (a container with ``--network none`` and the same relay)."""

from ._api import (
    ExecResult,
    ExecTimeout,
    Limits,
    PhaseHook,
    ProxyEndpoint,
    ResourceLimitExceeded,
    Runtime,
    RuntimeUnavailable,
    SandboxError,
)
from ._bwrap import BwrapRuntime, bwrap_usable
from ._docker import DockerRuntime, docker_usable
from ._local import LocalRuntime
from ._relay import SessionRelay

__all__ = [
    "BwrapRuntime",
    "DockerRuntime",
    "ExecResult",
    "ExecTimeout",
    "Limits",
    "LocalRuntime",
    "PhaseHook",
    "ProxyEndpoint",
    "ResourceLimitExceeded",
    "Runtime",
    "RuntimeUnavailable",
    "SandboxError",
    "SessionRelay",
    "bwrap_usable",
    "docker_usable",
]
