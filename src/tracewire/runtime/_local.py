"""The ``local`` runtime: the agent is a plain subprocess on the host, in a temp workdir.

UNSAFE for untrusted agents: the program sees the host's files, processes and network as
the user running tracewire does; only the workdir and the process group are its own, and
a process that leaves the group (``setsid``) outlives the rollout. Use it for trusted
programs and for debugging; use ``bwrap`` or ``docker`` for a policy being trained.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from ._api import ExecResult, Limits, Runtime, SandboxError
from ._limits import prlimit_argv
from ._proc import ProcessHook, run_process

__all__ = ["LocalRuntime"]


class LocalRuntime(Runtime):
    """A subprocess on the host, cwd a fresh temp dir, the host's environment plus the
    session's variables, rlimits (CPU, file size, open files) through ``prlimit`` when it
    is installed and limits are asked for. Not a sandbox.

    ``workdir_prefix`` names the temp dir; ``check_program``: look ``argv[0]`` up before
    starting it (False: the error of starting it is the error); ``on_process`` hears each
    command's start (its pid) and exit (see :data:`ProcessHook`). A ``CommandHarness``
    without a runtime runs its program in one of these.
    """

    name = "local"

    def __init__(self, *, inherit_env: bool = True, limits: Limits | None = None,
                 workdir_prefix: str = "tracewire-local-", check_program: bool = True,
                 on_process: ProcessHook | None = None, **kwargs: Any) -> None:
        # No limits unless asked for: a trusted host program runs as it would on its own.
        super().__init__(limits=limits or Limits(None, None, None, None, None), **kwargs)
        self.inherit_env = inherit_env
        self.workdir_prefix = workdir_prefix
        self.check_program = check_program
        #: Told ``("spawn", pid)`` and ``("exit", status)`` of each command, as they happen.
        self.on_process = on_process
        self._dir: Path | None = None

    def host_workdir(self) -> Path:
        """The temp workdir (the agent sees the same path)."""
        if self._dir is None:
            raise SandboxError("local runtime not booted")
        return self._dir

    async def _boot(self) -> None:
        self._dir = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix=self.workdir_prefix))
        self.workdir = str(self._dir)

    async def _exec(self, argv: list[str], env: dict[str, str], cwd: str | None,
                    timeout: float | None, stdin: bytes | None) -> ExecResult:
        # The trainer's session-API token never reaches the agent.
        base = ({k: v for k, v in os.environ.items() if k != "TRACEWIRE_SESSION_TOKEN"}
                if self.inherit_env else {"PATH": os.defpath})
        full = {**base, **self._agent_env(env)}
        where = self.host_workdir() / cwd if cwd else self.host_workdir()
        prog = argv[0] if "/" not in argv[0] else str(where / argv[0])
        if self.check_program and shutil.which(prog, path=full.get("PATH", os.defpath)) is None:
            # Checked here because prlimit, not us, would otherwise be the one failing.
            raise SandboxError(f"cannot start {argv[0]!r}: not found or not executable")
        result = ExecResult(argv=argv)
        self.last_result = result
        # Only rlimits that hold for root too; processes/memory would need a cgroup.
        limits = prlimit_argv(self.limits, nproc=False, address_space=False)
        return await run_process(limits + argv, result, env=full, cwd=where,
                                 timeout=timeout, stdin=stdin, on_process=self.on_process)

    async def _close(self) -> None:
        if self._dir is not None:
            await asyncio.to_thread(shutil.rmtree, self._dir, True)
            self._dir = None
