"""Resource limits for a sandboxed command: rlimits through util-linux ``prlimit``, and a
cgroup (v2, or v1 ``pids``/``memory`` hierarchies) for processes and memory.

Why both: the kernel ignores ``RLIMIT_NPROC`` for root, and tracewire often runs as root
in containers, so only a cgroup's ``pids.max`` stops a fork bomb there; a cgroup's memory
limit also counts every process of the sandbox together, where ``RLIMIT_AS`` is per
process and breaks programs that reserve large address ranges (node, Go, the JVM).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path

from ._api import Limits

log = logging.getLogger("tracewire.runtime")
_warned: set[str] = set()


def _unavailable(why: str) -> None:
    """Say once per reason why sandboxes get rlimits instead of a cgroup."""
    if why not in _warned:
        _warned.add(why)
        log.warning("sandbox cgroup not made (%s): processes/memory limits fall back to "
                    "rlimits, which do not stop a fork bomb run as root", why)

__all__ = ["Cgroup", "own_cgroups", "prlimit_argv"]

def prlimit_argv(limits: Limits, *, nproc: bool, address_space: bool) -> list[str]:
    """``prlimit --cpu=… --fsize=… --`` (empty when prlimit is missing or nothing is set);
    ``nproc``/``address_space`` add the rlimit fallbacks for processes and memory."""
    exe = shutil.which("prlimit")
    if exe is None:
        return []
    args = []
    if limits.cpu_s is not None:
        args.append(f"--cpu={limits.cpu_s}")
    if limits.file_bytes is not None:
        args.append(f"--fsize={limits.file_bytes}")
    if limits.open_files is not None:
        args.append(f"--nofile={limits.open_files}")
    if nproc and limits.processes is not None:
        args.append(f"--nproc={limits.processes}")
    if address_space and limits.memory_bytes is not None:
        args.append(f"--as={limits.memory_bytes}")
    return [exe, *args, "--"] if args else []


def _write(path: Path, text: str) -> None:
    path.write_text(text, encoding="ascii")


def _counter(path: Path, key: str) -> int:
    """The value after ``key`` in a ``key value`` file (0 when absent)."""
    with contextlib.suppress(OSError, ValueError):
        for line in path.read_text().splitlines():
            k, _, v = line.partition(" ")
            if k == key:
                return int(v)
    return 0


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _mounts(mountinfo: str) -> list[tuple[str, str, str, set[str]]]:
    """(fs type, root inside the hierarchy, mount point, options) of each cgroup mount."""
    out = []
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        f, r = left.split(), right.split()
        if not sep or len(f) < 5 or len(r) < 3 or r[0] not in ("cgroup", "cgroup2"):
            continue
        out.append((r[0], _unescape(f[3]), _unescape(f[4]), set(r[2].split(","))))
    return out


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash as octal escapes.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _inside(mount_root: str, path: str) -> str | None:
    """``path`` relative to a mount of its hierarchy rooted at ``mount_root`` (None: the
    mount does not show it)."""
    if ".." in path.split("/"):
        return None  # outside this cgroup namespace's root: not reachable by a path here
    root = mount_root.rstrip("/")
    if not root:
        return path.lstrip("/")
    if path == root:
        return ""
    if path.startswith(root + "/"):
        return path[len(root) + 1:]
    return None


def own_cgroups(controllers: list[str], *, proc_cgroup: str | None = None,
                mountinfo: str | None = None) -> dict[str, tuple[Path, bool]]:
    """For each controller, the directory of this process's own cgroup in the hierarchy
    that has it and whether that is v2 (read from ``/proc/self/cgroup`` and the mount
    table, or the texts given; a controller in a v1 hierarchy is taken from there, as on
    hybrid systems)."""
    own_v1: dict[str, str] = {}
    own_v2: str | None = None
    if proc_cgroup is None:
        proc_cgroup = _read("/proc/self/cgroup")
    for line in proc_cgroup.splitlines():
        hid, _, rest = line.partition(":")
        ctrls, _, where = rest.partition(":")
        if hid == "0" and ctrls == "":
            own_v2 = where
        for c in ctrls.split(","):
            if c:
                own_v1[c] = where
    mounts = _mounts(_read("/proc/self/mountinfo") if mountinfo is None else mountinfo)
    found: dict[str, tuple[Path, bool]] = {}
    for ctrl in controllers:
        v1 = own_v1.get(ctrl)
        if v1 is not None:
            for kind, root, point, opts in mounts:
                rel = _inside(root, v1) if kind == "cgroup" and ctrl in opts else None
                if rel is not None:
                    found[ctrl] = (Path(point) / rel, False)
                    break
            continue
        if own_v2 is None:
            continue
        for kind, root, point, _opts in mounts:
            rel = _inside(root, own_v2) if kind == "cgroup2" else None
            if rel is None:
                continue
            d = Path(point) / rel
            if _delegate_v2(d, ctrl):
                found[ctrl] = (d, True)
            break
    return found


def _delegate_v2(d: Path, ctrl: str) -> bool:
    """Whether children of ``d`` get ``ctrl`` (enabling it when allowed: the kernel
    refuses where ``d`` itself holds processes and is not the root, the rule that no
    cgroup holds both processes and controlled children)."""
    try:
        if ctrl not in (d / "cgroup.controllers").read_text().split():
            return False
        if ctrl in (d / "cgroup.subtree_control").read_text().split():
            return True
        _write(d / "cgroup.subtree_control", f"+{ctrl}")
        return True
    except OSError:
        return False


class Cgroup:
    """One sandbox's cgroup(s), below this process's own (so the container or slice that
    runs tracewire still accounts for it): made at boot, joined by each command before it
    starts, emptied and removed at close. ``make`` returns None when none can be made."""

    def __init__(self, dirs: dict[str, Path], v2: bool) -> None:
        self.dirs = dirs
        self.v2 = v2

    @classmethod
    def make(cls, limits: Limits, record: Callable[[Path], None] | None = None
             ) -> Cgroup | None:
        """A new cgroup below this process's own holding ``limits.processes``/
        ``memory_bytes`` (None if impossible). ``record(dir)`` is called before each
        directory is made, so a marker names it before it exists (for the reaper)."""
        if limits.processes is None and limits.memory_bytes is None:
            return None
        name = "tracewire-" + secrets.token_hex(6)
        wanted = [c for c, v in (("pids", limits.processes), ("memory", limits.memory_bytes))
                  if v is not None]
        places = own_cgroups(wanted)
        dirs: dict[str, Path] = {}
        v2 = False
        try:
            for ctrl in wanted:
                where = places.get(ctrl)
                if where is None:
                    continue
                parent, is_v2 = where
                if is_v2:
                    v2 = True
                    if "unified" not in dirs:
                        dirs["unified"] = cls._mkdir(parent / name, record)
                else:
                    dirs[ctrl] = cls._mkdir(parent / name, record)
        except OSError as exc:
            cls(dirs, v2).remove()
            _unavailable(f"cannot make {name} below this process's cgroup: {exc.strerror}")
            return None
        if not dirs:
            _unavailable(f"no {'/'.join(wanted)} controller in this process's cgroup that "
                         "may have children (on cgroup v2 they must be delegated to it)")
            return None
        cg = cls(dirs, v2)
        try:
            cg._set(limits)
        except OSError as exc:
            cg.remove()
            _unavailable(f"cannot set its limits: {exc}")
            return None
        return cg

    @staticmethod
    def _mkdir(d: Path, record: Callable[[Path], None] | None) -> Path:
        if record is not None:
            record(d)
        d.mkdir()
        return d

    def _set(self, limits: Limits) -> None:
        if self.v2:
            d = self.dirs["unified"]
            if limits.processes is not None:
                _write(d / "pids.max", str(limits.processes))
            if limits.memory_bytes is not None:
                _write(d / "memory.max", str(limits.memory_bytes))
                with contextlib.suppress(OSError):
                    _write(d / "memory.swap.max", "0")
            return
        if "pids" in self.dirs and limits.processes is not None:
            _write(self.dirs["pids"] / "pids.max", str(limits.processes))
        if "memory" in self.dirs and limits.memory_bytes is not None:
            _write(self.dirs["memory"] / "memory.limit_in_bytes", str(limits.memory_bytes))
            with contextlib.suppress(OSError):
                _write(self.dirs["memory"] / "memory.swappiness", "0")

    @property
    def procs_files(self) -> list[str]:
        """The ``cgroup.procs`` files a command writes its pid into before it starts."""
        return [str(d / "cgroup.procs") for d in self.dirs.values()]

    def join_argv(self) -> list[str]:
        """``sh -c 'echo $$ > …; exec "$@"' sh`` so the command is in the cgroup from its
        first instruction (no window in which it could fork outside)."""
        script = "".join(f'echo $$ > "{p}" && ' for p in self.procs_files) + 'exec "$@"'
        return ["/bin/sh", "-c", script, "sh"]

    def counters(self) -> dict[str, int]:
        """How often each limit has stopped something so far."""
        if self.v2:
            d = self.dirs["unified"]
            out = {}
            if (d / "pids.max").exists():
                out["processes"] = _counter(d / "pids.events", "max")
            if (d / "memory.max").exists():
                out["memory"] = _counter(d / "memory.events", "oom_kill")
            return out
        out = {}
        if "pids" in self.dirs:
            out["processes"] = _counter(self.dirs["pids"] / "pids.events", "max")
        if "memory" in self.dirs:
            d = self.dirs["memory"]
            oom = _counter(d / "memory.oom_control", "oom_kill")
            with contextlib.suppress(OSError, ValueError):
                oom = oom or int((d / "memory.failcnt").read_text())
            out["memory"] = oom
        return out

    def kill_all(self) -> None:
        """SIGKILL every process still in the cgroup."""
        for f in self.procs_files:
            with contextlib.suppress(OSError, ValueError):
                for pid in Path(f).read_text().split():
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(int(pid), signal.SIGKILL)

    def remove(self) -> None:
        """Kill what is left and remove the cgroup directories (blocking, brief)."""
        for d in self.dirs.values():
            for _ in range(50):
                self.kill_all()
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02)  # the killed processes are still being reaped
