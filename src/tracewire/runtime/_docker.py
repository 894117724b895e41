"""The ``docker`` runtime (also podman): one container per rollout, ``--network none``, the
same Unix-socket relay as ``bwrap`` as the container's only way out, limits from the
engine (``--memory``, ``--pids-limit``, ulimits), and ``rm -f`` of the container on every
path out. A harness that dies without closing (SIGKILL included) leaves its container
running: each container is labelled with its owner (``_reap.py``), and the next boot, or
the dead harness's janitor, removes those whose owner is gone, with their state
directories (``$TMPDIR/tw-docker-*``, held by an owner lock like bwrap's).

The container's main process is the relay launcher (``python3 /run/tracewire/launch.py``),
so the image needs a ``python3`` (any 3.8+, stdlib only); commands run with ``exec``. No
image is pulled: build one from a local root filesystem, e.g. from the host's own::

    tar -C / -c usr etc/ssl etc/ca-certificates etc/alternatives \\
        | docker import --change 'CMD ["/bin/sh"]' - tracewire-sandbox:local

(then add ``/bin``, ``/lib``… links for a merged-/usr system: ``docker build`` with a
``FROM tracewire-sandbox:local`` and ``RUN ln -s usr/bin /bin`` … or import a debootstrap
tree). Its tests run where ``TRACEWIRE_DOCKER_IMAGE`` is set and a daemon answers, and
skip elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ._api import ExecResult, RuntimeUnavailable
from ._proc import run_process
from ._reap import DOCKER_PREFIX, Marker, owner_labels, start_janitor
from ._sandbox import INSIDE_RUN, INSIDE_WORKDIR, LAUNCH, SIGNAL_LIMITS, SandboxRuntime

__all__ = ["DockerRuntime", "docker_usable"]


async def _run(*argv: str, timeout: float = 60.0) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return -1, f"{argv[0]} timed out"
    return proc.returncode or 0, out.decode(errors="replace").strip()


async def docker_usable(engine: str = "docker", image: str | None = None) -> str | None:
    """None when ``engine`` reaches a daemon (and has ``image``, if given), else why not."""
    exe = shutil.which(engine)
    if exe is None:
        return f"{engine} is not installed"
    code, out = await _run(exe, "info", timeout=15)
    if code != 0:
        last = out.splitlines()[-1] if out else ""
        return f"no {engine} daemon reachable ({last})"
    if image is not None:
        code, out = await _run(exe, "image", "inspect", image, timeout=15)
        if code != 0:
            return f"image {image!r} not present (images cannot be pulled here)"
    return None


class DockerRuntime(SandboxRuntime):
    """One container per rollout from ``image`` (see the module doc for building one).

    ``engine``: ``docker`` or ``podman``; ``python``: the image's interpreter for the
    relay; ``ro_paths``: host paths mounted read-only at the same path.
    """

    name = "docker"

    def __init__(
        self,
        image: str,
        *,
        engine: str = "docker",
        python: str = "python3",
        ro_paths: Sequence[str | os.PathLike[str]] = (),
        run_args: Sequence[str] = (),
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.image = image
        self.engine = shutil.which(engine) or engine
        self.python = python
        self.ro_paths = [os.path.abspath(p) for p in ro_paths]
        self.run_args = list(run_args)
        self.container = "tracewire-" + secrets.token_hex(6)
        self._started = False
        self._marker: Marker | None = None

    def run_argv(self) -> list[str]:
        """The ``docker run …`` command line that starts the container."""
        assert self._state is not None
        lim = self.limits
        a = [self.engine, "run", "-d", "--name", self.container, "--network", "none",
             "--cap-drop", "ALL", "--security-opt", "no-new-privileges", "--read-only",
             "--tmpfs", f"/tmp:rw,exec,size={lim.disk_bytes or 1 << 30}",
             "-v", f"{self._state / 'work'}:{INSIDE_WORKDIR}",
             "-v", f"{self._state / 'run'}:{INSIDE_RUN}:ro", "-w", INSIDE_WORKDIR,
             "--label", "tracewire.runtime=1", "--entrypoint", self.python]
        for k, v in owner_labels(self._state).items():
            a += ["--label", f"{k}={v}"]
        if lim.memory_bytes is not None:
            a += ["--memory", str(lim.memory_bytes), "--memory-swap", str(lim.memory_bytes)]
        if lim.processes is not None:
            a += ["--pids-limit", str(lim.processes)]
        for name, value in (("cpu", lim.cpu_s), ("fsize", lim.file_bytes),
                            ("nofile", lim.open_files)):
            if value is not None:
                a += ["--ulimit", f"{name}={value}:{value}"]
        for p in self.ro_paths:
            a += ["-v", f"{p}:{p}:ro"]
        # The launcher is the container's main process (the entrypoint is the image's
        # python); each exec'd command runs beside it, reaching the session through it.
        return [*a, *self.run_args, self.image, *self.launcher_args()]

    async def _boot(self) -> None:
        engine = shutil.which(self.engine)
        if engine is None:
            raise RuntimeUnavailable(f"{self.engine} is not installed")
        tmp = tempfile.gettempdir()
        # Containers and directories of harnesses that died go first; a janitor removes
        # this process's own if it dies in turn.
        await asyncio.to_thread(start_janitor, tmp, engine)
        self._state = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix=DOCKER_PREFIX,
                                                   dir=tmp))
        self._marker = await asyncio.to_thread(Marker, self._state)
        await asyncio.to_thread(self._make_dirs, self._state)
        await self._start_relay()
        if self._relay is not None:
            # The container's root may differ from ours: let it reach the socket.
            await asyncio.to_thread(os.chmod, self._relay.socket_path, 0o666)
        self._started = True  # from here on, close removes the container whatever happens
        code, out = await _run(*self.run_argv(), timeout=120)
        if code != 0:
            raise RuntimeUnavailable(f"cannot start a container from {self.image!r}: {out}")

    @staticmethod
    def _make_dirs(state: Path) -> None:
        for d in ("work", "run"):
            (state / d).mkdir(mode=0o755)
        (state / "work").chmod(0o777)
        shutil.copy(LAUNCH, state / "run" / "launch.py")

    async def _exec(self, argv: list[str], env: dict[str, str], cwd: str | None,
                    timeout: float | None, stdin: bytes | None) -> ExecResult:
        a = [self.engine, "exec", "-w", self.inside(cwd)]
        if stdin is not None:
            a.append("-i")
        for k, v in {"HOME": INSIDE_WORKDIR, **self._agent_env(env)}.items():
            a += ["-e", f"{k}={v}"]
        result = ExecResult(argv=argv)
        self.last_result = result
        try:
            await run_process([*a, self.container, *argv], result, env=dict(os.environ),
                              cwd=None, timeout=timeout, stdin=stdin)
        finally:
            if result.timed_out or result.cancelled:
                # Killing the engine client leaves the command running in the container.
                await asyncio.shield(_run(self.engine, "exec", self.container, "kill", "-9",
                                          "-1", timeout=30))
        if result.exit_code not in (0, None) and not result.timed_out:
            result.limit = SIGNAL_LIMITS.get(result.exit_code or 0)
            if result.exit_code == 137:
                result.extra["note"] = "SIGKILL: likely the memory limit (docker reports " \
                                       "OOM only for the main process)"
        return result

    async def _close(self) -> None:
        if self._started:
            with contextlib.suppress(OSError):
                await _run(self.engine, "rm", "-f", self.container, timeout=60)
        await self._stop_relay()
        if self._state is not None:
            await asyncio.to_thread(shutil.rmtree, self._state, True)
            self._state = None
        if self._marker is not None:
            self._marker.release()
            self._marker = None
