"""Resource limits for a sandboxed command: rlimits through util-linux ``prlimit``, and a
cgroup (v2, or v1 ``pids``/``memory`` hierarchies) for processes and memory.

Why both: the kernel ignores ``RLIMIT_NPROC`` for root, and tracewire often runs as root
in containers, so only a cgroup's ``pids.max`` stops a fork bomb there; a cgroup's memory
limit also counts every process of the sandbox together, where ``RLIMIT_AS`` is per
process and breaks programs that reserve large address ranges (node, Go, the JVM).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import time
from pathlib import Path

from ._api import Limits

__all__ = ["Cgroup", "prlimit_argv"]

_ROOT = Path("/sys/fs/cgroup")


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


class Cgroup:
    """One sandbox's cgroup(s): made at boot, joined by each command before it starts,
    emptied and removed at close. ``make`` returns None when no cgroup can be made."""

    def __init__(self, dirs: dict[str, Path], v2: bool) -> None:
        self.dirs = dirs
        self.v2 = v2

    @classmethod
    def make(cls, limits: Limits) -> Cgroup | None:
        """A new cgroup holding ``limits.processes``/``memory_bytes`` (None if impossible)."""
        if limits.processes is None and limits.memory_bytes is None:
            return None
        name = "tracewire-" + secrets.token_hex(6)
        try:
            if (_ROOT / "cgroup.controllers").exists():
                return cls._make_v2(name, limits)
            return cls._make_v1(name, limits)
        except OSError:
            return None

    @classmethod
    def _make_v2(cls, name: str, limits: Limits) -> Cgroup | None:
        d = _ROOT / name
        d.mkdir()
        cg = cls({"unified": d}, v2=True)
        try:
            if limits.processes is not None:
                _write(d / "pids.max", str(limits.processes))
            if limits.memory_bytes is not None:
                _write(d / "memory.max", str(limits.memory_bytes))
                with contextlib.suppress(OSError):
                    _write(d / "memory.swap.max", "0")
        except OSError:
            cg.remove()
            return None
        return cg

    @classmethod
    def _make_v1(cls, name: str, limits: Limits) -> Cgroup | None:
        dirs: dict[str, Path] = {}
        cg = cls(dirs, v2=False)
        try:
            if limits.processes is not None:
                dirs["pids"] = _ROOT / "pids" / name
                dirs["pids"].mkdir()
                _write(dirs["pids"] / "pids.max", str(limits.processes))
            if limits.memory_bytes is not None:
                dirs["memory"] = _ROOT / "memory" / name
                dirs["memory"].mkdir()
                _write(dirs["memory"] / "memory.limit_in_bytes", str(limits.memory_bytes))
                with contextlib.suppress(OSError):
                    _write(dirs["memory"] / "memory.swappiness", "0")
        except OSError:
            cg.remove()
            return None
        return cg

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
            return {"processes": _counter(d / "pids.events", "max"),
                    "memory": _counter(d / "memory.events", "oom_kill")}
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
