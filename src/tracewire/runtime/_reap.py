"""Finding and removing what dead harnesses' sandboxes left: their ``tw-bwrap-*`` and
``tw-docker-*`` directories, the cgroups and tmpfs mounts those name, any process still
in them, and the containers of the ``docker`` runtime.

Each live sandbox directory holds ``owner.lock``, a small JSON file (the owner's pid, its
cgroup directories and mounts) on which the owning process holds an ``flock`` for the
runtime's life. The kernel drops the lock when that process dies, however it dies
(SIGKILL included), so a directory whose lock can be taken is stale. A directory without
the file (being made, or made by an older tracewire) is never touched, nor one owned by
another user, nor a cgroup or mount path that does not have the shape this part makes.

Containers outlive their client, so each carries labels naming its owner
(``tracewire.owner``: pid and start time, so a reused pid is not mistaken for it), the pid
namespace that pid means something in (``tracewire.pidns``: boot id and namespace inode)
and its state directory (``tracewire.state``). :func:`reap_containers` removes those of
this pid namespace whose owner is gone; containers of another boot, namespace or machine
(a shared daemon) are left alone.

Stdlib only: also run as ``python3 -I -S _reap.py watch TMPDIR PID [ENGINE]`` (the
janitor a harness starts with its first sandbox), which waits for EOF on stdin (the
harness holds the other end, so EOF means it died) and then reaps what it left.
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
import subprocess
import sys
import threading
import time
from pathlib import Path

__all__ = ["DOCKER_PREFIX", "LABEL_OWNER", "LABEL_PIDNS", "LABEL_STATE", "MARKER", "PREFIX",
           "Marker", "owner_labels", "process_start", "reap_containers", "reap_dir",
           "reap_stale", "start_janitor"]

MARKER = "owner.lock"
PREFIX = "tw-bwrap-"
DOCKER_PREFIX = "tw-docker-"
LABEL_OWNER = "tracewire.owner"
LABEL_PIDNS = "tracewire.pidns"
LABEL_STATE = "tracewire.state"
#: What a janitor's engine client needs of the environment (its daemon, its config).
_ENGINE_ENV = ("PATH", "HOME", "XDG_RUNTIME_DIR", "XDG_CONFIG_HOME", "DOCKER_HOST",
               "DOCKER_CONFIG", "DOCKER_CONTEXT", "DOCKER_CERT_PATH", "DOCKER_TLS_VERIFY",
               "CONTAINER_HOST", "CONTAINERS_CONF", "CONTAINER_CONNECTION")
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


def reap_stale(tmpdir: str, owner: int | None = None, wait_s: float = 0.0,
               prefix: str = PREFIX) -> list[str]:
    """Reap every stale sandbox directory named ``prefix*`` under ``tmpdir``; returns the
    paths removed."""
    removed: list[str] = []
    try:
        names = [n for n in os.listdir(tmpdir) if n.startswith(prefix)]
    except OSError:
        return removed
    for name in names:
        state = Path(tmpdir) / name
        if _try_reap(state, owner, wait_s):
            removed.append(str(state))
    return removed


def process_start(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot), or None when there is no
    such process or it has died (a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        fields = stat[stat.rindex(b")") + 2:].split()
        return None if fields[0] in (b"Z", b"X") else int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


_UNKNOWN = "unknown"


def _pidns() -> str:
    """The boot and pid namespace this process's pids are valid in (``unknown`` without
    a readable ``/proc``)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        ns = os.readlink("/proc/self/ns/pid")  # "pid:[INODE]"
    except OSError:
        return _UNKNOWN
    return f"{boot}:{ns[ns.find('[') + 1:].rstrip(']')}"


def owner_labels(state: Path) -> dict[str, str]:
    """The labels naming this process (and ``state``) as a container's owner."""
    return {LABEL_OWNER: f"{os.getpid()}:{process_start(os.getpid())}",
            LABEL_PIDNS: _pidns(), LABEL_STATE: str(state)}


def _owner_gone(owner: str) -> bool:
    pid, _, start = owner.partition(":")
    if not pid.isdigit():
        return False  # not a label this module wrote: leave it alone
    alive = process_start(int(pid))
    return alive is None or str(alive) != start


def _engine(engine: str, *args: str) -> tuple[int, str]:
    try:
        out = subprocess.run([engine, *args], stdin=subprocess.DEVNULL,
                             capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return -1, str(exc)
    return out.returncode, out.stdout.decode(errors="replace")


def _id_and_labels(c: object) -> tuple[str | None, dict[str, str]]:
    """A container's id and string labels from one ``inspect`` entry."""
    if not isinstance(c, dict) or not isinstance(c.get("Id"), str):
        return None, {}
    config = c.get("Config")
    labels = config.get("Labels") if isinstance(config, dict) else None
    if not isinstance(labels, dict):
        return c["Id"], {}
    return c["Id"], {k: v for k, v in labels.items() if isinstance(v, str)}


def reap_containers(engine: str) -> list[str]:
    """``rm -f`` every container of this pid namespace whose owner is gone, and reap its
    state directory; returns the ids removed (an engine that fails removes nothing)."""
    here = _pidns()
    if here == _UNKNOWN:
        return []  # no /proc to judge owners by: every one would look gone
    code, out = _engine(engine, "ps", "-a", "-q", "--filter", f"label={LABEL_OWNER}",
                        "--filter", f"label={LABEL_PIDNS}={here}")
    ids = out.split()
    if code != 0 or not ids:
        return []
    code, out = _engine(engine, "inspect", *ids)
    try:
        found = json.loads(out)
    except ValueError:
        return []  # every container vanished (exit 1, no JSON) or an engine we cannot read
    dead: list[str] = []
    states: list[str] = []
    for c in found if isinstance(found, list) else []:
        cid, labels = _id_and_labels(c)
        # The filter is the engine's; the labels are checked again here.
        if cid is None or labels.get(LABEL_PIDNS) != here \
                or not _owner_gone(labels.get(LABEL_OWNER, "")):
            continue
        dead.append(cid)
        states.append(labels.get(LABEL_STATE, ""))
    if not dead:
        return []
    _engine(engine, "rm", "-f", *dead)  # one already gone fails alone; the rest still go
    for st in states:
        path = Path(st)
        # Only a directory of the shape this part makes, and (in _try_reap) only when its
        # owner lock is free and it is ours.
        if path.is_absolute() and ".." not in path.parts \
                and path.name.startswith(DOCKER_PREFIX):
            _try_reap(path, None, 0.0)
    return dead


_janitor: dict[tuple[str, str], int] = {}  # (tmpdir, engine) -> pid that started its janitor
_janitor_pipes: list[int] = []
_janitor_lock = threading.Lock()  # boots run start_janitor in worker threads, concurrently


def start_janitor(tmpdir: str, engine: str | None = None) -> None:
    """Reap leftovers now, and start (once per process, ``tmpdir`` and ``engine``) a
    janitor that reaps this process's sandboxes when it dies, SIGKILL included.

    Without ``engine``: ``tw-bwrap-*`` directories; with it: that engine's containers and
    the ``tw-docker-*`` directories."""
    _reap_now(tmpdir, engine)
    with _janitor_lock:
        if _janitor.get((tmpdir, engine or "")) != os.getpid():
            _spawn_janitor(tmpdir, engine)


def _reap_now(tmpdir: str, engine: str | None, owner: int | None = None,
              wait_s: float = 0.0) -> None:
    if engine is None:
        reap_stale(tmpdir, owner=owner, wait_s=wait_s)
        return
    reap_containers(engine)
    reap_stale(tmpdir, owner=owner, wait_s=wait_s, prefix=DOCKER_PREFIX)


def _spawn_janitor(tmpdir: str, engine: str | None) -> None:
    r, w = os.pipe()  # both non-inheritable; the janitor gets r as its stdin only
    env = {"PATH": os.defpath}
    if engine is not None:
        env.update({k: v for k, v in os.environ.items() if k in _ENGINE_ENV})
    try:
        os.posix_spawn(
            os.path.realpath(sys.executable),
            [sys.executable, "-I", "-S", os.path.abspath(__file__), "watch", tmpdir,
             str(os.getpid()), *([engine] if engine is not None else [])],
            env, file_actions=[(os.POSIX_SPAWN_DUP2, r, 0)], setsid=True)
    except OSError as exc:
        os.close(w)
        # Not fatal: without a janitor, leftovers wait for the next boot's reaping.
        logging.getLogger("tracewire.runtime").warning(
            "no sandbox janitor (%s): a killed harness's sandboxes are reaped at the next "
            "start only", exc)
        _janitor[(tmpdir, engine or "")] = os.getpid()
        return
    finally:
        os.close(r)
    # The write end stays open, unused, for this process's life: its close is the signal.
    _janitor_pipes.append(w)
    _janitor[(tmpdir, engine or "")] = os.getpid()


def _watch(tmpdir: str, owner: int, engine: str | None) -> int:
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
    if engine is not None:
        # Its descriptors close before it is a zombie: wait for it to be gone, since a
        # container's owner is judged by its pid (the directories by their lock).
        deadline = time.monotonic() + 5.0
        while process_start(owner) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
    _reap_now(tmpdir, engine, owner=owner, wait_s=5.0)
    return 0


if __name__ == "__main__":
    if len(sys.argv) in (4, 5) and sys.argv[1] == "watch":
        sys.exit(_watch(sys.argv[2], int(sys.argv[3]),
                        sys.argv[4] if len(sys.argv) == 5 else None))
    sys.stderr.write("usage: _reap.py watch TMPDIR PID [ENGINE]\n")
    sys.exit(2)
