"""The ``command`` harness: any program as the agent, pointed at its proxy session.

The program gets ``OPENAI_BASE_URL``/``OPENAI_API_KEY`` and ``ANTHROPIC_BASE_URL``/
``ANTHROPIC_API_KEY`` for its session (plus ``TRACEWIRE_MODEL``, ``TRACEWIRE_TASK_FILE``,
``TRACEWIRE_TASK_KEY``, ``TRACEWIRE_SESSION``), the task on stdin and/or as a JSON file, and
its own process group so a deadline kills it and everything it started. Its exit code and
the tails of stdout/stderr are recorded in ``trace.info["command"]`` (also when it is
stopped early: what it printed so far); a non-zero exit is an agent error.

Without ``runtime`` the program is a host subprocess (unsafe for untrusted agents), run by
a :class:`~tracewire.runtime.LocalRuntime` the harness keeps to itself: the rollout has no
``runtime`` then, and ``trace.info["command"]`` holds the program's ``pid`` (no runtime
name, no boot/close spans). With one (a :data:`RuntimeFactory`, or a name the composition
root resolves: ``local``, ``bwrap``, ``docker``) it runs there: the runtime boots in the
boot phase, its workdir holds the task files, ``rollout.runtime`` lets finalize hooks (and
:func:`runtime_of`, scoring functions) run commands in it, and it is closed at cleanup on
every path out.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from .._errors import EnvError
from ..trace import Span, StopReason, Trace
from ._context import Rollout
from ._harness import Harness
from ._runtime import (
    PresetLike,
    RuntimeFactory,
    RuntimeLike,
    register,
    unregister,
)
from ._task import Task

if TYPE_CHECKING:
    from ..runtime import LocalRuntime

__all__ = ["CommandFailed", "CommandHarness"]

#: Where ``rollout.state`` keeps the harness's own LocalRuntime (no runtime given).
_HOST = "host_runtime"
#: Task-file contents: a mapping of relative paths to text or bytes.
Files = Mapping[str, "str | bytes"]


class CommandFailed(EnvError):
    """The agent program exited with a non-zero status."""


def _default_input(task: Task) -> str:
    return json.dumps({"key": task.key, **task.data}, ensure_ascii=False)


@dataclass(frozen=True)
class _Urls:
    base_url: str
    anthropic_base_url: str


@dataclass(frozen=True)
class _HostPlace:
    """Where a host subprocess runs, for filling in a preset's templates."""

    workdir: str
    agent_endpoint: _Urls


def _phase_hook(trace: Trace) -> Callable[[str, float, float], None]:
    """Record a runtime's boot and close as ``runtime_boot``/``runtime_close`` spans."""

    def hook(phase: str, started: float, ended: float) -> None:
        if phase in ("boot", "close"):
            offset = time.time() - time.monotonic()
            trace.timing[f"runtime_{phase}"] = Span(start=started + offset, end=ended + offset)

    return hook


class CommandHarness(Harness):
    """Run ``argv`` (a list, or ``argv(task)``) as the agent; in it ``{python}`` becomes the
    current interpreter, ``{task_file}`` the task file's path and ``{workdir}`` the workdir
    (both as the program sees them).

    ``input`` chooses how the task reaches the program: ``stdin``, ``file`` or ``both``;
    ``task_input(task)`` makes the text (default: the task row as JSON). ``files(task)``
    adds files to the workdir. ``runtime``: where the program runs (see the module doc);
    with one, ``cwd`` is relative to its workdir. Use :meth:`from_preset` for a known CLI.
    """

    kind = "command"
    uses_sdk = False

    def __init__(
        self,
        argv: Sequence[str] | Callable[[Task], Sequence[str]] = (),
        *,
        input: Literal["stdin", "file", "both"] = "both",
        task_input: Callable[[Task], str] = _default_input,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        files: Callable[[Task], Files] | None = None,
        runtime: RuntimeFactory | str | None = None,
        preset: Callable[[Task], PresetLike] | None = None,
    ) -> None:
        self.argv = argv
        self.input = input
        self.task_input = task_input
        self.env = dict(env or {})
        self.cwd = cwd
        self.files = files
        self.runtime = runtime
        self.preset = preset

    @classmethod
    def from_preset(
        cls, preset: Callable[[Task], PresetLike], *, input: Literal["stdin", "file", "both"]
        = "file", **kwargs: Any,
    ) -> CommandHarness:
        """A harness running the agent CLI that ``preset(task)`` configures (e.g. a
        ``tracewire.runtime.claude_code(...)`` for the task's prompt); the task file is in
        the workdir, stdin is empty (``-p``-style CLIs would read it as more prompt)."""
        return cls(input=input, preset=preset, **kwargs)

    def with_runtime(self, runtime: RuntimeFactory | str | None) -> CommandHarness:
        """A copy of this harness running its program in ``runtime``."""
        other = copy.copy(self)
        other.runtime = runtime
        return other

    # -- boot / cleanup ----------------------------------------------------------------
    def _factory(self) -> RuntimeFactory | None:
        if isinstance(self.runtime, str):
            raise EnvError(
                f"runtime {self.runtime!r} is a name: run through tracewire.evaluate or "
                "`tracewire eval` (which resolve it), or pass a factory such as "
                f"tracewire.compose.runtime_factory({self.runtime!r})")
        return self.runtime

    async def boot(self, rollout: Rollout) -> None:
        """Make the workdir (a scratch directory, or the runtime's) and put the task file,
        the task's files and the preset's config files there."""
        text = self.task_input(rollout.task)
        rollout.state["task_input"] = text
        files: dict[str, str | bytes] = {}
        if self.input in ("file", "both"):
            files["task.json"] = text
        if self.files is not None:
            files.update(await asyncio.to_thread(self.files, rollout.task))
        factory = self._factory()
        rt: RuntimeLike
        if factory is None:
            rt = await self._boot_host(rollout)
            s = rollout.session
            # The session's own URLs: the program reaches the proxy as the harness does.
            place: Any = _HostPlace(rt.workdir, _Urls(s.base_url, s.anthropic_base_url))
        else:
            rt = factory(rollout.session, _phase_hook(rollout.trace))
            rollout.runtime = rt
            register(rollout.trace, rt)
            await rt.boot()
            rollout.workdir = rt.host_workdir()
            place = rt
        if self.preset is not None:
            preset = self.preset(rollout.task)
            # A sandbox that resolves executables itself (``provide``, in render) names
            # what is missing and where it looked; elsewhere the host PATH decides.
            missing = [] if hasattr(place, "provide") else preset.missing()
            if missing:
                raise EnvError(f"{preset.name}: {', '.join(missing)} not installed")
            argv, env, extra = preset.render(place, rollout.model)
            rollout.state["preset"] = (preset.name, argv, env)
            files.update(extra)
        await rt.put_files(files)

    async def _boot_host(self, rollout: Rollout) -> LocalRuntime:
        """The harness's own LocalRuntime for a program without a runtime (kept in
        ``rollout.state``, not ``rollout.runtime``: nothing else runs commands there)."""
        # Imported here: chat and tools rollouts never pay for importing the runtimes.
        from ..runtime import LocalRuntime

        host = LocalRuntime(
            workdir_prefix="tracewire-cmd-",
            # A failed start is reported as starting it failed (no lookup of its own), and
            # task files are as large as the environment makes them: as a host subprocess
            # has always had it.
            check_program=False, max_file_bytes=sys.maxsize)
        rollout.state[_HOST] = host
        await host.boot()
        rollout.workdir = host.host_workdir()
        return host

    async def cleanup(self, rollout: Rollout) -> None:
        """Close the runtime (the harness's own one included: its workdir goes with it)."""
        rt = rollout.runtime
        if rt is not None:
            unregister(rollout.trace)
            await rt.close()
        host: LocalRuntime | None = rollout.state.pop(_HOST, None)
        if host is not None:
            await host.close()

    # -- the command -------------------------------------------------------------------
    def _workdir_seen(self, rollout: Rollout) -> str:
        if rollout.runtime is not None:
            return rollout.runtime.workdir
        return str(rollout.workdir) if rollout.workdir is not None else ""

    def _argv(self, rollout: Rollout) -> list[str]:
        preset = rollout.state.get("preset")
        if preset is not None:
            return list(preset[1])
        raw = self.argv(rollout.task) if callable(self.argv) else self.argv
        workdir = self._workdir_seen(rollout)
        task_file = f"{workdir}/task.json" if workdir else ""
        return [a.replace("{python}", sys.executable).replace("{task_file}", task_file)
                .replace("{workdir}", workdir) for a in raw]

    def _own_env(self, rollout: Rollout) -> dict[str, str]:
        """The harness's variables (the session's come from the runtime, or are added for
        a host subprocess)."""
        environ = {
            "TRACEWIRE_MODEL": rollout.model,
            "TRACEWIRE_TASK_KEY": rollout.task.key,
            "TRACEWIRE_SAMPLING": json.dumps(rollout.sampling),
        }
        if self.input in ("file", "both") and self._workdir_seen(rollout):
            environ["TRACEWIRE_TASK_FILE"] = f"{self._workdir_seen(rollout)}/task.json"
        environ.update(self.env)
        preset = rollout.state.get("preset")
        if preset is not None:
            environ.update(preset[2])
        return environ

    def _session_env(self, rollout: Rollout) -> dict[str, str]:
        """The session's variables for a host subprocess (a runtime adds its own: the
        session as the program reaches it from there)."""
        s = rollout.session
        return {
            "OPENAI_BASE_URL": s.base_url,
            "OPENAI_API_KEY": s.secret,
            "ANTHROPIC_BASE_URL": s.anthropic_base_url,
            "ANTHROPIC_API_KEY": s.secret,
            "TRACEWIRE_SESSION": s.id,
        }

    async def run(self, rollout: Rollout) -> None:
        """Start the program, feed the task, wait for it; stop it if cancelled."""
        argv = self._argv(rollout)
        if not argv:
            raise EnvError("command harness: empty argv")
        info: dict[str, Any] = {"argv": argv}
        preset = rollout.state.get("preset")
        if preset is not None:
            info["preset"] = preset[0]
        rollout.trace.info["command"] = info
        if rollout.runtime is not None:
            await self._run_in(rollout.runtime, rollout, argv, info)
        else:
            await self._run_host(rollout.state[_HOST], rollout, argv, info)
        rollout.state["stdout"] = info["stdout"]
        code = info["exit_code"]
        if code != 0:
            last = info["stderr"].strip().splitlines()[-1:] or [""]
            raise CommandFailed(f"exit code {code}: {last[0][:500]}".rstrip(": "))
        rollout.stop(StopReason.DONE)

    def _stdin(self, rollout: Rollout) -> str | None:
        if self.input == "file":
            return None
        text: str = rollout.state.get("task_input") or self.task_input(rollout.task)
        return text

    async def _run_in(self, rt: RuntimeLike, rollout: Rollout, argv: list[str],
                      info: dict[str, Any]) -> None:
        info["runtime"] = rt.name
        rollout.trace.notify()
        cwd = None if self.cwd is None else os.fspath(self.cwd)
        try:
            res = await rt.exec(argv, env=self._own_env(rollout), cwd=cwd,
                                stdin=self._stdin(rollout))
        except BaseException:
            # Cancelled (the agent deadline) or failed: keep what it printed so far.
            info["killed"] = True
            last = rt.last_result
            if last is not None:
                info.update(exit_code=last.exit_code, stdout=_text(last.stdout),
                            stderr=_text(last.stderr))
            raise
        info.update(exit_code=res.exit_code, stdout=_text(res.stdout),
                    stderr=_text(res.stderr), duration_s=round(res.duration_s, 4))
        if res.limit is not None:
            info["limit"] = res.limit
            err = res.error()
            raise err if err is not None else CommandFailed(f"stopped by the {res.limit} limit")

    async def _run_host(self, host: LocalRuntime, rollout: Rollout, argv: list[str],
                        info: dict[str, Any]) -> None:
        # ``info`` is filled as a host subprocess's always was: its pid once it started
        # (the live view shows it), its own exit status, ``killed`` when the rollout
        # stopped it, then the tails of its output.
        def seen(event: str, value: int) -> None:
            if event == "spawn":
                info["pid"] = value
                rollout.trace.notify()
            else:
                info["exit_code"] = value

        from ..runtime import SandboxError  # imported with LocalRuntime at boot

        host.on_process = seen
        # This process's working directory, not the workdir, anchors a relative cwd (joined,
        # not normalised: the kernel resolves ``..`` after links, as it did for the child).
        cwd = None if self.cwd is None else os.path.join(os.getcwd(), os.fspath(self.cwd))
        try:
            await host.exec(argv, env={**self._session_env(rollout), **self._own_env(rollout)},
                            cwd=cwd, stdin=self._stdin(rollout))
        except BaseException as exc:
            if "pid" not in info:
                # It never started: recorded as the harness's EnvError, not the runtime's
                # SandboxError, whatever runs it.
                if isinstance(exc, SandboxError):
                    raise EnvError(str(exc)) from exc
                raise
            info["killed"] = True
            raise
        finally:
            last = host.last_result
            if "pid" in info and last is not None:
                info["stdout"], info["stderr"] = _text(last.stdout), _text(last.stderr)


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace")
