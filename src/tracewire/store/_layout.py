"""On-disk layout of a run directory, its metadata file and its writer lock.

::

    runs/<run>/
      meta.json              config, versions, start/end time, status (atomically replaced)
      lock                   flock()ed by the writer too, for builds that lock only this file
      index.sqlite           one row per episode (WAL while written; one file once closed)
      segments/00000000.twr  append-only binary records, rolled at a size limit
      live/<episode>.twj     journals of in-flight episodes (delta records)

The writer lock is an ``flock`` on a descriptor of the run directory itself: no file
inside can be deleted or replaced to break it (a lock on a file alone ends for the next
writer once the file is deleted and made anew). Free means "no live writer".
"""

from __future__ import annotations

import errno
import fcntl
import os
import platform
import time
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import orjson

from .._errors import StoreError
from ..trace import SCHEMA_VERSION, new_id
from ._status import FsyncPolicy, RunStatus

__all__ = [
    "FORMAT",
    "Layout",
    "WriterLock",
    "atomic_write",
    "fsync_dir",
    "new_meta",
    "read_meta",
    "store_error",
]

FORMAT = "tracewire-run/1"
_SEG_SUFFIX = ".twr"
JOURNAL_SUFFIX = ".twj"


def store_error(what: str, exc: BaseException) -> StoreError:
    """A :class:`StoreError` naming ``what`` failed and why (keeps ``errno``)."""
    if isinstance(exc, StoreError):
        return exc
    code = getattr(exc, "errno", None)
    if code == errno.EFBIG:
        why = "file size limit reached"
    elif code == errno.ENOSPC:
        why = "no space left on device"
    elif code in (errno.EACCES, errno.EPERM, errno.EROFS):
        why = "permission denied"
    else:
        why = str(exc) or type(exc).__name__
    err = StoreError(code or 0, f"{what}: {why}")
    return err


class Layout:
    """Paths inside one run directory."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.meta = self.root / "meta.json"
        self.lock = self.root / "lock"
        self.index = self.root / "index.sqlite"
        self.segments = self.root / "segments"
        self.live = self.root / "live"

    def segment(self, n: int) -> Path:
        """Path of segment number ``n``."""
        return self.segments / f"{n:08d}{_SEG_SUFFIX}"

    def segment_numbers(self) -> list[int]:
        """Numbers of the segments present, ascending."""
        if not self.segments.is_dir():
            return []
        out = []
        for p in self.segments.iterdir():
            if p.suffix == _SEG_SUFFIX and p.stem.isdigit():
                out.append(int(p.stem))
        return sorted(out)

    def journal(self, episode_id: str) -> Path:
        """Path of the journal of in-flight episode ``episode_id``."""
        return self.live / f"{episode_id}{JOURNAL_SUFFIX}"

    def journals(self) -> list[Path]:
        """Journal files present, oldest first."""
        if not self.live.is_dir():
            return []
        found = [p for p in self.live.iterdir() if p.suffix == JOURNAL_SUFFIX]
        return sorted(found, key=lambda p: (p.stat().st_mtime if p.exists() else 0, p.name))

    def try_lock(self) -> WriterLock | None:
        """Take the writer lock without waiting (the directory must exist), or None if a
        writer holds it. A probe (:meth:`writer_alive`) holds it shared for a moment, so a
        busy lock is retried for up to ~50 ms before giving up."""
        dfd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            if not _flock_retry(dfd):
                os.close(dfd)
                return None
            ffd = os.open(self.lock, os.O_RDWR | os.O_CREAT, 0o644)
        except BaseException:
            os.close(dfd)
            raise
        if not _flock_retry(ffd):
            # An older build's writer, which locks only the file, holds the run.
            os.close(ffd)
            os.close(dfd)
            return None
        return WriterLock(dfd, ffd)

    def writer_alive(self) -> bool:
        """True while a writer holds the run's lock (probed read-only; creates nothing)."""
        for path, flags in ((self.root, os.O_RDONLY | os.O_DIRECTORY), (self.lock, os.O_RDONLY)):
            try:
                fd = os.open(path, flags)
            except OSError:
                continue  # no lock file: no older-build writer ever ran here
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            except OSError:
                pass
            finally:
                os.close(fd)  # closing releases a shared lock taken here
        return False

    @staticmethod
    def unlock(lock: WriterLock) -> None:
        """Release a lock from :meth:`try_lock`."""
        lock.release()


class WriterLock:
    """A held writer lock: the run directory's descriptor (the lock that counts) and the
    ``lock`` file's (for older builds); :meth:`release` closes both."""

    __slots__ = ("_fds",)

    def __init__(self, dir_fd: int, file_fd: int) -> None:
        self._fds = [dir_fd, file_fd]

    def release(self) -> None:
        """Release the lock (idempotent); closing a descriptor drops its flock."""
        fds, self._fds = self._fds, []
        for fd in fds:
            os.close(fd)


def _flock_retry(fd: int, tries: int = 10) -> bool:
    for k in range(tries):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if k + 1 < tries:
                time.sleep(0.005)
    return False


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (new or renamed files) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so readers see the old or the new file, never a mix."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def new_meta(name: str, config: dict[str, Any], fsync: str, segment_bytes: int) -> dict[str, Any]:
    """Metadata of a fresh run."""
    from .._version import __version__

    now = time.time()
    return {
        "format": FORMAT,
        "id": new_id(),
        "name": name,
        "status": RunStatus.RUNNING.value,
        "created": now,
        "started": now,
        "ended": None,
        "config": config,
        "store": {"fsync": FsyncPolicy(fsync).value, "segment_bytes": segment_bytes},
        "versions": {
            "tracewire": __version__,
            "schema": SCHEMA_VERSION,
            "python": platform.python_version(),
            "numpy": np.__version__,
            "msgspec": msgspec.__version__,
        },
    }


def read_meta(layout: Layout) -> dict[str, Any]:
    """The run's metadata; ``StoreError`` when missing or unreadable."""
    try:
        meta = orjson.loads(layout.meta.read_bytes())
    except FileNotFoundError as exc:
        raise StoreError(errno.ENOENT, f"{layout.root} is not a run (no meta.json)") from exc
    except OSError as exc:
        raise store_error(f"cannot read {layout.meta}", exc) from exc
    except orjson.JSONDecodeError as exc:
        raise StoreError(0, f"{layout.meta} is not valid JSON: {exc}") from exc
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise StoreError(0, f"{layout.root} is not a {FORMAT} run directory")
    return meta


def write_meta(layout: Layout, meta: dict[str, Any]) -> None:
    """Atomically replace the metadata file."""
    try:
        atomic_write(layout.meta, orjson.dumps(meta, option=orjson.OPT_INDENT_2))
    except OSError as exc:
        raise store_error(f"cannot write {layout.meta}", exc) from exc
