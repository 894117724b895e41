"""The runtime seam: where an agent program runs, with its files, its limits and its only
way out (the rollout's proxy session).

A :class:`Runtime` is used once per rollout as an async context manager::

    async with BwrapRuntime(endpoint=ProxyEndpoint.from_session(s)) as rt:
        await rt.put_files({"task.json": text})
        result = await rt.exec(["python3", "agent.py"], timeout=60)
        files = await rt.get_files(["answer.txt"])

``close`` is idempotent and runs on every path out (error, timeout, cancellation), leaving
no process and no file of the rollout behind.
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
import os
import time
import urllib.parse
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._errors import PhaseTimeout
from ._errors import RuntimeUnavailable, SandboxError

__all__ = [
    "ExecResult",
    "ExecTimeout",
    "Limits",
    "PhaseHook",
    "ProxyEndpoint",
    "ResourceLimitExceeded",
    "Runtime",
    "RuntimeUnavailable",
    "SandboxError",
]

#: Called as ``hook(phase, started, ended)`` (``time.monotonic`` seconds) for ``boot``,
#: ``exec`` and ``close``, so a harness can put them into the trace's phases.
PhaseHook = Callable[[str, float, float], None]

#: Bytes of stdout/stderr kept (the tail) per stream, per exec.
OUTPUT_TAIL = 64 * 1024
#: The trainer's session-API token variable (``tracewire.sessions.TOKEN_ENV``; spelled
#: out here because this part imports no other) and its file-name sibling.
TOKEN_VAR = "TRACEWIRE_SESSION_TOKEN"
_TOKEN_VARS = frozenset({TOKEN_VAR, TOKEN_VAR + "_FILE"})


class ExecTimeout(PhaseTimeout):
    """A command ran past its timeout and was killed; ``result`` holds what it printed."""

    def __init__(self, message: str, result: ExecResult) -> None:
        super().__init__(message)
        self.result = result


class ResourceLimitExceeded(SandboxError):
    """A command was stopped by a resource limit (``limit``: cpu, memory, processes, file,
    disk)."""

    def __init__(self, message: str, limit: str, result: ExecResult) -> None:
        super().__init__(message)
        self.limit = limit
        self.result = result


@dataclass(frozen=True)
class Limits:
    """Per-exec resource limits; None leaves one unlimited.

    ``cpu_s`` (CPU seconds per process) and ``file_bytes`` (largest file written) are
    rlimits; ``memory_bytes`` and ``processes`` use a cgroup when one can be made (exact,
    and the only thing that stops a fork bomb run as root) and fall back to rlimits
    (``RLIMIT_AS`` / ``RLIMIT_NPROC``, the latter ignored by the kernel for root).
    ``disk_bytes`` bounds what ``/workspace`` and ``/tmp`` hold together (``bwrap``: a
    tmpfs of that size, whose pages also count as the sandbox's memory; ``docker``: the
    ``/tmp`` tmpfs only); a command that fills it is stopped (limit ``disk``).
    """

    cpu_s: int | None = 600
    memory_bytes: int | None = 4 << 30
    processes: int | None = 256
    file_bytes: int | None = 1 << 30
    open_files: int | None = 4096
    disk_bytes: int | None = None


@dataclass(frozen=True)
class ProxyEndpoint:
    """The one place a sandboxed agent may talk to: a proxy session at ``host:port``, its
    ``id`` and ``secret`` (the names of ``proxy.Session`` and ``sessions.SessionInfo``)."""

    host: str
    port: int
    id: str
    secret: str = ""

    @classmethod
    def from_session(cls, session: Any) -> ProxyEndpoint:
        """Build from a proxy ``Session`` (its ``base_url``, ``id`` and ``secret``)."""
        url = urllib.parse.urlsplit(str(session.base_url))
        if url.hostname is None or url.port is None:
            raise SandboxError(f"session URL without host:port: {session.base_url!r}")
        return cls(url.hostname, url.port, str(session.id), str(session.secret))

    @property
    def base_url(self) -> str:
        """The session's OpenAI base URL (``…/sessions/<id>/v1``)."""
        return f"http://{self.host}:{self.port}/sessions/{self.id}/v1"

    @property
    def anthropic_base_url(self) -> str:
        """The session's Anthropic base URL (``…/sessions/<id>``)."""
        return f"http://{self.host}:{self.port}/sessions/{self.id}"

    @property
    def session_id(self) -> str:
        """Deprecated name of :attr:`id` (kept for one release)."""
        warnings.warn("ProxyEndpoint.session_id is now ProxyEndpoint.id; the old name goes "
                      "in the next release", DeprecationWarning, stacklevel=2)
        return self.id

    def on_loopback(self) -> ProxyEndpoint:
        """The same session as a sandbox's agent reaches it: ``127.0.0.1:<port>``."""
        return dataclasses.replace(self, host="127.0.0.1")


@dataclass
class ExecResult:
    """What one command did: exit status (negative: killed by that signal), the tails of
    its output, and why it stopped when it did not stop by itself."""

    argv: list[str]
    exit_code: int | None = None
    stdout: bytes = b""
    stderr: bytes = b""
    timed_out: bool = False
    cancelled: bool = False
    limit: str | None = None
    duration_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when the command exited 0 by itself."""
        return self.exit_code == 0 and not (self.timed_out or self.cancelled or self.limit)

    def error(self) -> SandboxError | ExecTimeout | None:
        """The typed error a harness records for this result (None when it exited 0)."""
        if self.timed_out:
            return ExecTimeout(f"{self.argv[:1]} timed out after {self.duration_s:.1f}s", self)
        if self.limit is not None:
            return ResourceLimitExceeded(
                f"{self.argv[:1]} stopped by the {self.limit} limit", self.limit, self)
        if self.exit_code != 0:
            tail = self.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
            return SandboxError(f"exit code {self.exit_code}: {tail[0][:500]}".rstrip(": "))
        return None

    def to_info(self) -> dict[str, Any]:
        """A JSON-able summary for ``trace.info`` (output decoded as UTF-8)."""
        return {
            "argv": self.argv, "exit_code": self.exit_code, "timed_out": self.timed_out,
            "cancelled": self.cancelled, "limit": self.limit,
            "duration_s": round(self.duration_s, 4),
            "stdout": self.stdout.decode("utf-8", "replace"),
            "stderr": self.stderr.decode("utf-8", "replace"), **self.extra,
        }


class Runtime(abc.ABC):
    """Where one rollout's agent runs. Subclasses implement ``_boot``, ``_exec``,
    ``_close`` and say where the workdir lives on the host (``host_workdir``)."""

    #: Short name for the command line and records (``local``, ``bwrap``, ``docker``).
    name: str = ""
    #: Path of the workdir as the agent sees it.
    workdir: str = ""

    def __init__(
        self,
        *,
        endpoint: ProxyEndpoint | None = None,
        limits: Limits | None = None,
        env: Mapping[str, str] | None = None,
        on_phase: PhaseHook | None = None,
        max_file_bytes: int = 64 << 20,
    ) -> None:
        self.endpoint = endpoint
        self.limits = limits or Limits()
        self.env = dict(env or {})
        self.on_phase = on_phase
        self.max_file_bytes = max_file_bytes
        #: The latest exec's result, filled in as output arrives (kept when cancelled).
        self.last_result: ExecResult | None = None
        self._booted = False
        self._closed = False
        self._close_lock = asyncio.Lock()

    # -- lifecycle ---------------------------------------------------------------------
    async def boot(self) -> None:
        """Prepare the runtime (dirs, relay, container); closes what it made if it fails."""
        if self._closed:
            raise SandboxError(f"{self.name} runtime already closed")
        if self._booted:
            return
        t0 = time.monotonic()
        try:
            await self._boot()
        except BaseException:
            await self.close()
            raise
        self._booted = True
        self._phase("boot", t0)

    async def close(self) -> None:
        """Kill what still runs and remove every file of the rollout; safe to call twice
        and shielded from cancellation so cleanup always finishes."""
        if self._closed:
            return
        self._closed = True
        t0 = time.monotonic()
        task = asyncio.ensure_future(self._close())
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            await task  # finish cleaning up, then let the cancellation through
            raise
        finally:
            self._phase("close", t0)

    async def __aenter__(self) -> Runtime:
        await self.boot()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- commands and files ------------------------------------------------------------
    async def exec(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        stdin: bytes | str | None = None,
    ) -> ExecResult:
        """Run ``argv`` to its end or ``timeout``; returns its status and output (on a
        timeout, what was printed so far, with ``timed_out`` set). ``cwd`` is relative to
        the workdir (or a path inside the sandbox)."""
        self._check_live()
        if not argv:
            raise SandboxError("exec: empty argv")
        data = stdin.encode() if isinstance(stdin, str) else stdin
        t0 = time.monotonic()
        try:
            return await self._exec(list(argv), dict(env or {}), cwd, timeout, data)
        finally:
            self._phase("exec", t0)

    async def put_files(self, files: Mapping[str, bytes | str]) -> None:
        """Write files (paths relative to the workdir) into the workdir."""
        self._check_live()
        from ._files import write_files

        await asyncio.to_thread(write_files, self.host_workdir(), files, self.max_file_bytes)

    async def get_files(self, paths: Sequence[str]) -> dict[str, bytes]:
        """Read files (relative to the workdir) out of it; never follows a link outside
        it; a missing file is left out of the answer."""
        self._check_live()
        from ._files import read_files

        return await asyncio.to_thread(
            read_files, self.host_workdir(), paths, self.max_file_bytes)

    @abc.abstractmethod
    def host_workdir(self) -> Path:
        """The workdir's path on the host (valid between boot and close)."""

    @abc.abstractmethod
    async def _boot(self) -> None: ...

    @abc.abstractmethod
    async def _exec(self, argv: list[str], env: dict[str, str], cwd: str | None,
                    timeout: float | None, stdin: bytes | None) -> ExecResult: ...

    @abc.abstractmethod
    async def _close(self) -> None: ...

    def _check_live(self) -> None:
        if self._closed:
            raise SandboxError(f"{self.name} runtime is closed")
        if not self._booted:
            raise SandboxError(f"{self.name} runtime not booted")

    def _phase(self, name: str, t0: float) -> None:
        if self.on_phase is not None:
            self.on_phase(name, t0, time.monotonic())

    @property
    def agent_endpoint(self) -> ProxyEndpoint | None:
        """The endpoint as the agent addresses it (sandboxes: on their own loopback)."""
        return self.endpoint

    def _agent_env(self, extra: Mapping[str, str]) -> dict[str, str]:
        """The session variables, then the runtime's env, then this exec's env; never the
        trainer's session-API token (by name, or by value under any other name)."""
        env: dict[str, str] = {}
        e = self.agent_endpoint
        if e is not None:
            env.update(
                OPENAI_BASE_URL=e.base_url, ANTHROPIC_BASE_URL=e.anthropic_base_url,
                TRACEWIRE_SESSION=e.id,
            )
            if e.secret:
                env.update(OPENAI_API_KEY=e.secret, ANTHROPIC_API_KEY=e.secret)
        env.update(self.env)
        env.update(extra)
        token = os.environ.get(TOKEN_VAR) or ""
        # By value too, when it is long enough not to match ordinary text by chance.
        return {k: v for k, v in env.items()
                if k not in _TOKEN_VARS and not (len(token) >= 8 and token in v)}


