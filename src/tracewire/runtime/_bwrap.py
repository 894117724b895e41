"""The ``bwrap`` runtime: each command runs in a fresh bubblewrap sandbox.

What the agent sees: the host's ``/usr`` (and the ``/bin``, ``/lib*``, ``/sbin`` links or
dirs) read-only; a minimal ``/etc`` (passwd, group, hosts, and the host's CA certificates,
so TLS settings in the environment stay valid); a private writable ``/workspace`` holding
the task's files and a private ``/tmp``, both kept across the runtime's commands and
removed at close; its own PID, network, IPC and UTS namespaces, all capabilities dropped.
The network namespace holds only ``lo``; the rollout's proxy session answers there at
``127.0.0.1:<proxy port>`` through a relay to a bind-mounted Unix socket, so the session
URLs are the same as outside. Nothing else of the host is mounted: no home directories,
no host ``/tmp``, no project, run or store directory, except ``ro_paths`` the caller names.

Python agents: the interpreter tracewire runs on is bound read-only at its own path
(``sys.base_prefix``; the in-sandbox launcher needs it); a virtual environment with the
agent's packages must be passed in ``ro_paths``. On machines where Python lives in a home
directory (``/root/.pyenv``), only that prefix is bound, not the home directory.

Limits (:class:`Limits`): CPU seconds, file size and open files are rlimits set by
``prlimit``; processes and memory use a cgroup (v2 or v1) below this process's own when
tracewire may make one (as root, usually), else rlimits (``RLIMIT_NPROC`` does not bind
root: without a cgroup a fork bomb as root is only stopped by the timeout); ``disk_bytes``
is a tmpfs holding ``/workspace`` and ``/tmp`` (``_disk.py``).

Cleanup when the harness dies without closing: ``owner.lock`` in the runtime's directory
and the janitor (``_reap.py``); an executable outside ``/usr``: ``sandbox_path`` and
:meth:`BwrapRuntime.provide` (``_resolve.py``).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ._api import ExecResult, RuntimeUnavailable, SandboxError
from ._disk import disk_full, mount_tmpfs, unmount
from ._launch import PREFIX as RELAY_NOTE
from ._limits import Cgroup, prlimit_argv
from ._proc import run_process
from ._reap import PREFIX, Marker, start_janitor
from ._resolve import Exposure, expose
from ._sandbox import INSIDE_RUN, INSIDE_WORKDIR, LAUNCH, SIGNAL_LIMITS, SandboxRuntime

__all__ = ["BwrapRuntime", "bwrap_usable"]

_ETC_DIRS = ("/etc/ssl", "/etc/ca-certificates", "/etc/alternatives")
_ETC_FILES = ("/etc/ld.so.cache", "/etc/localtime", "/etc/mime.types")
_SYSTEM = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
#: Variables naming CA bundles; one whose file the sandbox cannot see is dropped, since
#: the openai SDK fails creating its client when it points at a missing file.
CA_VARS = ("SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
           "NODE_EXTRA_CA_CERTS", "AWS_CA_BUNDLE", "GIT_SSL_CAINFO", "PIP_CERT",
           "NIX_SSL_CERT_FILE", "HTTPLIB2_CA_CERTS", "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH")
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"


def _interpreter() -> tuple[str, str]:
    """(the real interpreter binary, its prefix) of the running Python."""
    exe = os.path.realpath(sys.executable)
    return exe, os.path.realpath(sys.base_prefix)


async def bwrap_usable() -> str | None:
    """None when bwrap can make a sandbox here, else the reason it cannot."""
    exe = shutil.which("bwrap")
    if exe is None:
        return "bwrap is not installed (Debian package: bubblewrap)"
    proc = await asyncio.create_subprocess_exec(
        exe, "--unshare-pid", "--unshare-net", "--die-with-parent", "--ro-bind", "/usr",
        "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
        "--symlink", "usr/lib64", "/lib64", "--proc", "/proc", "--dev", "/dev", "true",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    _, err = await proc.communicate()
    if proc.returncode != 0:
        return f"bwrap cannot make a sandbox here: {err.decode(errors='replace').strip()}"
    return None


class BwrapRuntime(SandboxRuntime):
    """Run each command in a bubblewrap sandbox (see the module doc for what it holds).

    ``ro_paths``: host paths bound read-only at the same path (a venv, a tool's install
    dir). ``rw_paths``: host paths bound writable (avoid for untrusted agents).
    ``sandbox_path``: host directories bound read-only and put first on the sandbox's
    ``PATH``, also searched by :meth:`provide` (e.g. an npm prefix's ``bin``).
    """

    name = "bwrap"
    _work = ("rw", "work")

    def __init__(
        self,
        *,
        ro_paths: Sequence[str | os.PathLike[str]] = (),
        rw_paths: Sequence[str | os.PathLike[str]] = (),
        sandbox_path: Sequence[str | os.PathLike[str]] = (),
        bwrap: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.ro_paths = [os.path.abspath(p) for p in ro_paths]
        self.rw_paths = [os.path.abspath(p) for p in rw_paths]
        self.sandbox_path = [os.path.abspath(p) for p in sandbox_path]
        self.bwrap = bwrap or shutil.which("bwrap") or ""
        self._cgroup: Cgroup | None = None
        self._marker: Marker | None = None
        self._mounted: Path | None = None
        self._exposed = Exposure()

    @property
    def search_path(self) -> str:
        """Where :meth:`provide` looks for executables: ``sandbox_path``, then the
        host's ``PATH`` (a preset's "is it installed" check uses the same)."""
        host = os.environ.get("PATH", os.defpath).split(os.pathsep)
        return os.pathsep.join(dict.fromkeys([*self.sandbox_path, *host]))

    def provide(self, names: Sequence[str]) -> dict[str, str]:
        """Make each executable of ``names`` runnable inside: find it on
        :attr:`search_path`, bind its directory, its real install tree and its ``#!``
        interpreter read-only, and put their directories on the sandbox ``PATH``.
        Returns name → path; ``SandboxError`` naming what is missing otherwise."""
        expose(names, self.search_path.split(os.pathsep), self._visible, self._exposed)
        return {n: self._exposed.found[n] for n in names}

    @property
    def cgroup(self) -> Cgroup | None:
        """The cgroup holding processes/memory limits (None when none could be made)."""
        return self._cgroup

    @property
    def disk_dir(self) -> Path | None:
        """The host directory holding ``/workspace`` and ``/tmp`` (a tmpfs of
        ``limits.disk_bytes`` when that is set)."""
        return self._state / "rw" if self._state is not None else None

    # -- lifecycle ---------------------------------------------------------------------
    async def _boot(self) -> None:
        if not self.bwrap:
            raise RuntimeUnavailable("bwrap is not installed (Debian package: bubblewrap)")
        missing = await asyncio.to_thread(
            lambda: [p for p in (*self.ro_paths, *self.rw_paths, *self.sandbox_path)
                     if not os.path.exists(p)])
        if missing:
            raise SandboxError(f"paths to bind into the sandbox do not exist: "
                               f"{', '.join(missing)}")
        tmp = tempfile.gettempdir()
        # Leftovers of harnesses that died (SIGKILL included) go first; a janitor process
        # removes this process's own if it dies in turn.
        await asyncio.to_thread(start_janitor, tmp)
        self._state = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix=PREFIX, dir=tmp))
        self._marker = await asyncio.to_thread(Marker, self._state)
        await asyncio.to_thread(self._make_dirs, self._state)
        await self._start_relay()
        marker = self._marker
        self._cgroup = await asyncio.to_thread(
            Cgroup.make, self.limits, lambda d: marker.add("cgroups", d))

    def _make_dirs(self, state: Path) -> None:
        for d in ("rw", "run", "etc"):
            (state / d).mkdir(mode=0o755)
        if self.limits.disk_bytes is not None:
            assert self._marker is not None
            self._marker.add("mounts", state / "rw")
            mount_tmpfs(state / "rw", self.limits.disk_bytes)
            self._mounted = state / "rw"
        for d in ("work", "tmp"):
            (state / "rw" / d).mkdir(mode=0o755)
        (state / "rw" / "tmp").chmod(0o1777)
        shutil.copy(LAUNCH, state / "run" / "launch.py")
        etc = state / "etc"
        (etc / "passwd").write_text(
            "root:x:0:0:root:/workspace:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n")
        (etc / "group").write_text("root:x:0:\nnogroup:x:65534:\n")
        (etc / "hosts").write_text("127.0.0.1 localhost\n::1 localhost\n")
        (etc / "nsswitch.conf").write_text("passwd: files\ngroup: files\nhosts: files\n")
        (etc / "resolv.conf").write_text("")
        # Mount points for the host files bound on top of this /etc.
        for d in _ETC_DIRS:
            if os.path.isdir(d):
                (etc / os.path.basename(d)).mkdir()
        for f in _ETC_FILES:
            if os.path.isfile(f):
                (etc / os.path.basename(f)).touch()

    async def _close(self) -> None:
        if self._cgroup is not None:
            await asyncio.to_thread(self._cgroup.remove)
            self._cgroup = None
        await self._stop_relay()
        if self._mounted is not None:
            await asyncio.to_thread(unmount, self._mounted)
            self._mounted = None
        if self._state is not None:
            await asyncio.to_thread(shutil.rmtree, self._state, True)
            self._state = None
        if self._marker is not None:
            self._marker.release()
            self._marker = None

    # -- commands ----------------------------------------------------------------------
    def sandbox_argv(self, argv: Sequence[str], cwd: str | None = None) -> list[str]:
        """The full ``bwrap …`` command line for ``argv`` (exposed for inspection)."""
        assert self._state is not None
        st = self._state
        a = [self.bwrap, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
             "--unshare-cgroup-try", "--die-with-parent", "--new-session",
             "--cap-drop", "ALL", "--ro-bind", "/usr", "/usr"]
        for p in _SYSTEM:
            if os.path.islink(p):
                a += ["--symlink", os.readlink(p), p]
            elif os.path.isdir(p):
                a += ["--ro-bind", p, p]
        a += ["--ro-bind", str(st / "etc"), "/etc"]
        for p in (*_ETC_DIRS, *_ETC_FILES):
            if os.path.exists(p):
                a += ["--ro-bind", p, p]
        a += ["--proc", "/proc", "--dev", "/dev",
              "--bind", str(st / "rw" / "work"), INSIDE_WORKDIR,
              "--bind", str(st / "rw" / "tmp"), "/tmp",
              "--ro-bind", str(st / "run"), INSIDE_RUN]
        _, prefix = _interpreter()
        for p in dict.fromkeys([prefix, *self.ro_paths, *self.sandbox_path,
                                *self._exposed.binds]):
            a += ["--ro-bind", p, p]
        for p in self.rw_paths:
            a += ["--bind", p, p]
        where = self.inside(cwd)
        a += ["--remount-ro", "/", "--chdir", where.rstrip("/") or "/", "--"]
        exe, _ = _interpreter()
        return [*a, exe, *self.launcher_args(), *argv]

    def _visible(self, path: str) -> bool:
        """Whether a host path is inside something bound into the sandbox."""
        _, prefix = _interpreter()
        roots = ("/usr", *_SYSTEM, *_ETC_DIRS, *_ETC_FILES, prefix, *self.ro_paths, *self.rw_paths,
                 *self.sandbox_path, *self._exposed.binds, INSIDE_WORKDIR, "/tmp")
        p = os.path.normpath(path)
        return any(p == r or p.startswith(r.rstrip("/") + "/") for r in roots)

    async def _exec(self, argv: list[str], env: dict[str, str], cwd: str | None,
                    timeout: float | None, stdin: bytes | None) -> ExecResult:
        path = ":".join(dict.fromkeys([*self.sandbox_path, *self._exposed.path,
                                       DEFAULT_PATH]))
        full = {"PATH": path, "HOME": INSIDE_WORKDIR, "TMPDIR": "/tmp",
                "LANG": "C.UTF-8", **self._agent_env(env)}
        for var in CA_VARS:
            if var in full and not self._visible(full[var]):
                del full[var]
        cg = self._cgroup
        before = cg.counters() if cg is not None else {}
        wrap = cg.join_argv() if cg is not None else []
        limits = prlimit_argv(self.limits, nproc=cg is None or "processes" not in before,
                              address_space=cg is None or "memory" not in before)
        result = ExecResult(argv=argv)
        self.last_result = result
        disk = self._mounted
        watch = (lambda: "disk" if disk_full(disk) else None) if disk is not None else None
        await run_process(wrap + limits + self.sandbox_argv(argv, cwd), result, env=full,
                          cwd=str(self.host_workdir()), timeout=timeout, stdin=stdin,
                          watch=watch)
        after = cg.counters() if cg is not None else {}
        fired = [k for k, v in after.items() if v > before.get(k, 0)]
        if fired:
            # Kept even when the command recovered and exited 0 (a fork bomb it stopped).
            result.extra["limits_hit"] = {k: after[k] - before.get(k, 0) for k in fired}
        if result.limit is None and not result.timed_out:
            if result.exit_code not in (0, None):
                result.limit = fired[0] if fired else SIGNAL_LIMITS.get(result.exit_code or 0)
            if result.limit is None and disk is not None and disk_full(disk):
                result.limit = "disk"
        notes = [line[len(RELAY_NOTE):] for line in result.stderr.decode(
            "utf-8", "replace").splitlines() if line.startswith(RELAY_NOTE)]
        if notes:
            result.extra["relay_errors"] = notes
        return result
