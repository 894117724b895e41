"""What a command harness needs from a runtime (where its agent program runs) and from an
agent preset, as protocols the env part owns.

``tracewire.runtime``'s ``LocalRuntime``/``BwrapRuntime``/``DockerRuntime`` and its
``AgentPreset`` satisfy them; the composition root (``tracewire.compose``) maps the names
``local``/``bwrap``/``docker`` to factories. A runtime lives from the rollout's boot phase to
its cleanup, so finalize hooks (``rollout.runtime``) and scoring functions
(:func:`runtime_of`) can run commands in it and read files out of it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from ..trace import Trace
from ._session import SessionLike

__all__ = [
    "EndpointLike",
    "ExecResultLike",
    "PhaseHook",
    "PlaceLike",
    "PresetLike",
    "RuntimeFactory",
    "RuntimeLike",
    "runtime_of",
]

#: ``hook(phase, started, ended)`` in ``time.monotonic`` seconds (``boot``, ``exec``,
#: ``close``), so the harness can put a runtime's start-up and tear-down on the trace.
PhaseHook = Callable[[str, float, float], None]


class EndpointLike(Protocol):
    """The proxy session as the agent addresses it from where it runs."""

    @property
    def base_url(self) -> str:
        """Base URL for OpenAI SDKs (ends in ``/v1``)."""
        ...

    @property
    def anthropic_base_url(self) -> str:
        """Base URL for the Anthropic SDK."""
        ...


class PlaceLike(Protocol):
    """Where an agent runs, as far as filling in a preset's templates goes."""

    @property
    def workdir(self) -> str:
        """The workdir as the agent sees it."""
        ...

    @property
    def agent_endpoint(self) -> EndpointLike | None:
        """The session's URLs as the agent reaches them."""
        ...


class ExecResultLike(Protocol):
    """What one command did (``tracewire.runtime.ExecResult``)."""

    @property
    def exit_code(self) -> int | None:
        """Exit status (None when it never finished)."""
        ...

    @property
    def stdout(self) -> bytes:
        """The tail of its standard output."""
        ...

    @property
    def stderr(self) -> bytes:
        """The tail of its standard error."""
        ...

    @property
    def limit(self) -> str | None:
        """The resource limit that stopped it (``cpu``, ``memory``, ``processes``, ``file``)."""
        ...

    @property
    def duration_s(self) -> float:
        """Wall time it ran, in seconds."""
        ...

    def error(self) -> Exception | None:
        """The typed error to record for it (None when it exited 0)."""
        ...


class RuntimeLike(PlaceLike, Protocol):
    """One rollout's place to run commands: boot, put files, exec, get files, close."""

    @property
    def name(self) -> str:
        """Short name (``local``, ``bwrap``, ``docker``), recorded with the command."""
        ...

    @property
    def last_result(self) -> ExecResultLike | None:
        """The latest command's result, filled in as output arrives (kept on cancel)."""
        ...

    async def boot(self) -> None:
        """Prepare the runtime; cleans up after itself when it fails."""
        ...

    async def close(self) -> None:
        """Kill what still runs and remove every file; idempotent, finishes when cancelled."""
        ...

    async def exec(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        stdin: bytes | str | None = None,
    ) -> ExecResultLike:
        """Run ``argv`` to its end (or ``timeout``) with the session's variables plus ``env``."""
        ...

    async def put_files(self, files: Mapping[str, bytes | str]) -> None:
        """Write files (paths relative to the workdir) into the workdir."""
        ...

    async def get_files(self, paths: Sequence[str]) -> dict[str, bytes]:
        """Read files (relative to the workdir) out of it; missing ones are left out."""
        ...

    def host_workdir(self) -> Path:
        """The workdir's path on the host."""
        ...


#: Makes one rollout's runtime for its proxy session; the harness boots and closes it.
RuntimeFactory = Callable[[SessionLike, PhaseHook], RuntimeLike]


class PresetLike(Protocol):
    """A known agent CLI's argv, environment and config files (``tracewire.runtime``'s
    ``claude_code``, ``codex``, ``mini_swe_agent``)."""

    @property
    def name(self) -> str:
        """The agent's name."""
        ...

    def missing(self, path: str | None = None) -> list[str]:
        """Executables it needs that are not on ``path``."""
        ...

    def render(self, runtime: PlaceLike, model: str | None = None
               ) -> tuple[list[str], dict[str, str], dict[str, str]]:
        """(argv, env, files) filled in for where it runs (``model``: the rollout's, used
        unless the preset names its own)."""
        ...


# Live runtimes by trace id, for scoring functions (they get the trace, not the rollout).
# Traces have __slots__ without __weakref__, hence ids; the harness removes its entry at
# cleanup, so the dict holds only rollouts in flight.
_LIVE: dict[str, RuntimeLike] = {}


def runtime_of(trace: Trace) -> RuntimeLike | None:
    """The runtime of the rollout recording ``trace`` while it is in flight (until its
    cleanup, so also during scoring); None without one."""
    return _LIVE.get(trace.id)


def register(trace: Trace, runtime: RuntimeLike) -> None:
    """Make ``runtime`` findable by :func:`runtime_of` (the harness calls it at boot)."""
    _LIVE[trace.id] = runtime


def unregister(trace: Trace) -> None:
    """Forget the trace's runtime (at cleanup)."""
    _LIVE.pop(trace.id, None)
