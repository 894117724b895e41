"""Finding and removing what dead harnesses' sandboxes left: their ``tw-bwrap-*``
directories, the cgroups and tmpfs mounts those name, and any process still in them.

Each live sandbox directory holds ``owner.lock``, a small JSON file (the owner's pid, its
cgroup directories and mounts) on which the owning process holds an ``flock`` for the
runtime's life. The kernel drops the lock when that process dies, however it dies
(SIGKILL included), so a directory whose lock can be taken is stale. A directory without
the file (being made, or made by an older tracewire) is never touched, nor one owned by
another user, nor a cgroup or mount path that does not have the shape this part makes.

Stdlib only: also run as ``python3 -I -S _reap.py watch TMPDIR PID`` (the janitor a
harness starts with its first sandbox), which waits for EOF on stdin (the harness holds
the other end, so EOF means it died) and then reaps what it left.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

__all__ = ["MARKER", "PREFIX", "Marker", "reap_dir", "reap_stale", "start_janitor"]

MARKER = "owner.lock"
PREFIX = "tw-bwrap-"
_CGROUP = re.compile(r"tracewire-[0-9a-f]{12}")
_MNT_DETACH = 2


class Marker:
    """The owner lock of one sandbox directory, held until :meth:`release`."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.info: dict[str, object] = {"pid": os.getpid(), "cgroups": [], "mounts": []}
        # Locked under a temporary name, then renamed: a reaper never sees the file
        # unlocked (it only opens MARKER).
        tmp = state / (MARKER + ".new")
        self.fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
            self._write()
            os.rename(tmp, state / MARKER)
        except BaseException:
            os.close(self.fd)
            raise

    def _write(self) -> None:
        data = json.dumps(self.info).encode()
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, data, 0)

    def add(self, kind: str, path: Path) -> None:
        """Name a cgroup or mount before it is made, so the reaper finds it."""
        items = self.info[kind]
        assert isinstance(items, list)
        items.append(str(path))
        self._write()

    def drop(self, kind: str, path: Path) -> None:
        """Forget a cgroup or mount that is gone."""
        items = self.info[kind]
        assert isinstance(items, list)
        with contextlib.suppress(ValueError):
            items.remove(str(path))
        self._write()

    def release(self) -> None:
        """Give the lock up (the directory is about to be removed)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _kill_cgroup(d: Path) -> None:
    for _ in range(100):
        with contextlib.suppress(OSError, ValueError):
            for pid in (d / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(pid), signal.SIGKILL)
        try:
            d.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.02)  # the killed processes are still being reaped


def _umount(path: str) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.umount2(path.encode(), _MNT_DETACH)


def _valid_cgroup(p: str) -> bool:
    path = Path(p)
    return (path.is_absolute() and ".." not in path.parts
            and p.startswith("/sys/fs/cgroup/") and bool(_CGROUP.fullmatch(path.name)))


def _strings(v: object) -> list[str]:
    return [x for x in v if isinstance(x, str)] if isinstance(v, list) else []


def reap_dir(state: Path, info: dict[str, object]) -> None:
    """Kill what is left in the directory's cgroups, remove them, unmount its tmpfs and
    remove the directory (the caller holds its lock)."""
    for p in _strings(info.get("cgroups")):
        if _valid_cgroup(p):
            _kill_cgroup(Path(p))
    for p in _strings(info.get("mounts")):
        if os.path.dirname(p) == str(state):
            with contextlib.suppress(OSError):
                _umount(p)
    shutil.rmtree(state, ignore_errors=True)


def _try_reap(state: Path, owner: int | None, wait_s: float) -> bool:
    """Reap ``state`` if its lock is free (waiting up to ``wait_s`` when its marker names
    ``owner``); True when it was removed."""
    try:
        st = os.lstat(state)
        fd = os.open(state / MARKER, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        mst = os.fstat(fd)
        if st.st_uid != os.getuid() or mst.st_uid != os.getuid() or not os.path.isdir(state) \
                or os.path.islink(state):
            return False
        try:
            info = json.loads(os.pread(fd, 1 << 16, 0) or b"{}")
        except ValueError:
            info = {}
        if not isinstance(info, dict):
            info = {}
        deadline = time.monotonic() + (wait_s if owner is not None
                                       and info.get("pid") == owner else 0.0)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    return False  # a live sandbox
                time.sleep(0.05)
        # Read again under the lock: the owner may have added a path before it died.
        with contextlib.suppress(ValueError):
            fresh = json.loads(os.pread(fd, 1 << 16, 0) or b"{}")
            if isinstance(fresh, dict):
                info = fresh
        reap_dir(state, info)
        return True
    finally:
        os.close(fd)


def reap_stale(tmpdir: str, owner: int | None = None, wait_s: float = 0.0) -> list[str]:
    """Reap every stale sandbox directory under ``tmpdir``; returns the paths removed."""
    removed: list[str] = []
    try:
        names = [n for n in os.listdir(tmpdir) if n.startswith(PREFIX)]
    except OSError:
        return removed
    for name in names:
        state = Path(tmpdir) / name
        if _try_reap(state, owner, wait_s):
            removed.append(str(state))
    return removed


_janitor: dict[str, int] = {}  # tmpdir -> pid of the process that started its janitor
_janitor_pipes: list[int] = []
_janitor_lock = threading.Lock()  # boots run start_janitor in worker threads, concurrently


def start_janitor(tmpdir: str) -> None:
    """Reap leftovers now, and start (once per process and ``tmpdir``) a janitor that
    reaps this process's sandboxes when it dies, SIGKILL included."""
    reap_stale(tmpdir)
    with _janitor_lock:
        if _janitor.get(tmpdir) != os.getpid():
            _spawn_janitor(tmpdir)


def _spawn_janitor(tmpdir: str) -> None:
    r, w = os.pipe()  # both non-inheritable; the janitor gets r as its stdin only
    try:
        os.posix_spawn(
            os.path.realpath(sys.executable),
            [sys.executable, "-I", "-S", os.path.abspath(__file__), "watch", tmpdir,
             str(os.getpid())],
            {"PATH": os.defpath}, file_actions=[(os.POSIX_SPAWN_DUP2, r, 0)], setsid=True)
    except OSError as exc:
        os.close(w)
        # Not fatal: without a janitor, leftovers wait for the next boot's reaping.
        logging.getLogger("tracewire.runtime").warning(
            "no sandbox janitor (%s): a killed harness's sandboxes are reaped at the next "
            "start only", exc)
        _janitor[tmpdir] = os.getpid()
        return
    finally:
        os.close(r)
    # The write end stays open, unused, for this process's life: its close is the signal.
    _janitor_pipes.append(w)
    _janitor[tmpdir] = os.getpid()


def _watch(tmpdir: str, owner: int) -> int:
    # Interrupts meant for the harness's terminal are not for us; we go when it goes.
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    while True:
        try:
            if not os.read(0, 4096):
                break
        except InterruptedError:
            continue
        except OSError:
            break
    reap_stale(tmpdir, owner=owner, wait_s=5.0)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "watch":
        sys.exit(_watch(sys.argv[2], int(sys.argv[3])))
    sys.stderr.write("usage: _reap.py watch TMPDIR PID\n")
    sys.exit(2)
