"""The ``command`` harness: any subprocess as the agent, pointed at its proxy session.

The program gets ``OPENAI_BASE_URL``/``OPENAI_API_KEY`` and ``ANTHROPIC_BASE_URL``/
``ANTHROPIC_API_KEY`` for its session (plus ``TRACEWIRE_MODEL``, ``TRACEWIRE_TASK_FILE``,
``TRACEWIRE_TASK_KEY``, ``TRACEWIRE_SESSION``), the task on stdin and/or as a JSON file, and
its own process group so a deadline kills it and everything it started. Its exit code and
the tails of stdout/stderr are recorded in ``trace.info["command"]``; a non-zero exit is an
agent error.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from .._errors import EnvError
from ..trace import StopReason
from ._api import Task
from ._context import Rollout
from ._harness import Harness

__all__ = ["CommandFailed", "CommandHarness"]

#: Bytes of stdout/stderr kept (the tail) per stream.
OUTPUT_TAIL = 64 * 1024
_KILL_GRACE_S = 2.0
PIPE, DEVNULL = asyncio.subprocess.PIPE, asyncio.subprocess.DEVNULL


class CommandFailed(EnvError):
    """The agent program exited with a non-zero status."""


def _default_input(task: Task) -> str:
    return json.dumps({"key": task.key, **task.data}, ensure_ascii=False)


async def _drain(stream: asyncio.StreamReader | None, limit: int) -> bytes:
    """Read a stream to its end, keeping only the last ``limit`` bytes."""
    if stream is None:
        return b""
    buf = bytearray()
    while chunk := await stream.read(65536):
        buf += chunk
        if len(buf) > 2 * limit:
            del buf[: len(buf) - limit]
    return bytes(buf[-limit:])


def _kill_group(proc: asyncio.subprocess.Process, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


class CommandHarness(Harness):
    """Run ``argv`` (a list, or ``argv(task)``) as the agent; ``{python}`` in it becomes the
    current interpreter, ``{task_file}`` the task file path.

    ``input`` chooses how the task reaches the program: ``stdin``, ``file`` or ``both``;
    ``task_input(task)`` makes the text (default: the task row as JSON).
    """

    kind = "command"
    uses_sdk = False

    def __init__(
        self,
        argv: Sequence[str] | Callable[[Task], Sequence[str]],
        *,
        input: Literal["stdin", "file", "both"] = "both",
        task_input: Callable[[Task], str] = _default_input,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
    ) -> None:
        self.argv = argv
        self.input = input
        self.task_input = task_input
        self.env = dict(env or {})
        self.cwd = cwd

    async def boot(self, rollout: Rollout) -> None:
        """Make the rollout's scratch directory and write the task file there."""
        workdir = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="tracewire-cmd-"))
        rollout.workdir = workdir
        text = self.task_input(rollout.task)
        rollout.state["task_input"] = text
        if self.input in ("file", "both"):
            await asyncio.to_thread((workdir / "task.json").write_text, text, "utf-8")

    async def cleanup(self, rollout: Rollout) -> None:
        """Remove the scratch directory."""
        if rollout.workdir is not None:
            await asyncio.to_thread(shutil.rmtree, rollout.workdir, True)

    def _argv(self, rollout: Rollout) -> list[str]:
        raw = self.argv(rollout.task) if callable(self.argv) else self.argv
        task_file = str(rollout.workdir / "task.json") if rollout.workdir else ""
        return [a.replace("{python}", sys.executable).replace("{task_file}", task_file)
                for a in raw]

    def _environ(self, rollout: Rollout) -> dict[str, str]:
        s = rollout.session
        # The trainer's session-API token never reaches the agent.
        environ = {k: v for k, v in os.environ.items() if k != "TRACEWIRE_SESSION_TOKEN"}
        environ.update(
            OPENAI_BASE_URL=s.base_url,
            OPENAI_API_KEY=s.secret,
            ANTHROPIC_BASE_URL=s.anthropic_base_url,
            ANTHROPIC_API_KEY=s.secret,
            TRACEWIRE_MODEL=rollout.model,
            TRACEWIRE_TASK_KEY=rollout.task.key,
            TRACEWIRE_SESSION=s.id,
            TRACEWIRE_SAMPLING=json.dumps(rollout.sampling),
        )
        if rollout.workdir is not None and self.input in ("file", "both"):
            environ["TRACEWIRE_TASK_FILE"] = str(rollout.workdir / "task.json")
        environ.update(self.env)
        return environ

    async def spawn(
        self, rollout: Rollout, argv: list[str], environ: dict[str, str]
    ) -> asyncio.subprocess.Process:
        """Start the agent program (the one place it is started: override to run it
        elsewhere); stdout and stderr are pipes, stdin a pipe unless ``input="file"``."""
        try:
            return await asyncio.create_subprocess_exec(
                *argv,
                stdin=PIPE if self.input != "file" else DEVNULL,
                stdout=PIPE,
                stderr=PIPE,
                env=environ,
                cwd=self.cwd if self.cwd is not None else rollout.workdir,
                start_new_session=True,
            )
        except OSError as exc:
            raise EnvError(f"cannot start {argv[0]!r}: {exc}") from exc

    async def terminate(self, proc: asyncio.subprocess.Process) -> None:
        """Stop a program that is still running when the rollout ends early (deadline or
        cancellation): SIGTERM to its process group, SIGKILL after a grace period."""
        _kill_group(proc, signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.shield(proc.wait()), _KILL_GRACE_S)
        except (TimeoutError, asyncio.CancelledError):
            _kill_group(proc, signal.SIGKILL)

    async def run(self, rollout: Rollout) -> None:
        """Start the program, feed the task, wait for it; stop it if cancelled."""
        argv = self._argv(rollout)
        if not argv:
            raise EnvError("command harness: empty argv")
        info: dict[str, Any] = {"argv": argv}
        rollout.trace.info["command"] = info
        proc = await self.spawn(rollout, argv, self._environ(rollout))
        info["pid"] = proc.pid
        rollout.trace.notify()
        out_task = asyncio.create_task(_drain(proc.stdout, OUTPUT_TAIL))
        err_task = asyncio.create_task(_drain(proc.stderr, OUTPUT_TAIL))
        try:
            if proc.stdin is not None:
                text = rollout.state.get("task_input") or self.task_input(rollout.task)
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    proc.stdin.write(text.encode())
                    await proc.stdin.drain()
                proc.stdin.close()
            code = await proc.wait()
            stdout, stderr = await asyncio.gather(out_task, err_task)
        except BaseException:
            await self.terminate(proc)
            info["killed"] = True
            out_task.cancel()
            err_task.cancel()
            raise
        finally:
            if proc.returncode is None:
                _kill_group(proc, signal.SIGKILL)
        info["exit_code"] = code
        info["stdout"] = stdout.decode("utf-8", "replace")
        info["stderr"] = stderr.decode("utf-8", "replace")
        rollout.state["stdout"] = info["stdout"]
        if code != 0:
            last = info["stderr"].strip().splitlines()[-1:] or [""]
            raise CommandFailed(f"exit code {code}: {last[0][:500]}".rstrip(": "))
        rollout.stop(StopReason.DONE)
