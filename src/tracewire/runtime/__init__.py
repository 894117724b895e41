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
from ._presets import AgentPreset, claude_code, codex, mini_swe_agent
from ._proc import ProcessHook
from ._relay import SessionRelay

__all__ = [
    "AgentPreset",
    "BwrapRuntime",
    "DockerRuntime",
    "ExecResult",
    "ExecTimeout",
    "Limits",
    "LocalRuntime",
    "PhaseHook",
    "ProcessHook",
    "ProxyEndpoint",
    "ResourceLimitExceeded",
    "Runtime",
    "RuntimeUnavailable",
    "SandboxError",
    "SessionRelay",
    "bwrap_usable",
    "claude_code",
    "codex",
    "docker_usable",
    "mini_swe_agent",
]
