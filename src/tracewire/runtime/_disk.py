"""A size bound for a sandbox's writable directories: a tmpfs of ``disk_bytes`` mounted on
the host under the runtime's own directory, holding ``/workspace`` and ``/tmp``.

Why a tmpfs: it is the one bound the kernel enforces on every write (``ENOSPC``) that
needs neither a loop device nor quotas on the host's file system, and it persists across a
runtime's commands (a tmpfs made by ``bwrap --size`` lives only as long as one sandbox)
while the host still reads and writes the task's files through it. Its pages are memory:
they count against the sandbox's memory cgroup, so ``memory_bytes`` must leave room for
what the agent writes. Mounting needs ``CAP_SYS_ADMIN`` (root, as the cgroups do).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from pathlib import Path

from ._errors import RuntimeUnavailable

__all__ = ["disk_full", "mount_tmpfs", "unmount"]

_MS_NOSUID, _MS_NODEV = 2, 4
_MNT_DETACH = 2
_libc: ctypes.CDLL | None = None


def _c() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def mount_tmpfs(path: Path, size: int) -> None:
    """Mount a tmpfs of ``size`` bytes (and as many inodes as 4 KiB pages, at least 1,024,
    so empty files cannot exhaust memory either) on ``path``."""
    inodes = max(1024, size // 4096)
    opts = f"size={size},nr_inodes={inodes},mode=0755".encode()
    if _c().mount(b"tmpfs", str(path).encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, opts) != 0:
        err = ctypes.get_errno()
        raise RuntimeUnavailable(
            f"Limits(disk_bytes=...) needs a tmpfs mount, which this process may not make "
            f"({os.strerror(err)}; it needs CAP_SYS_ADMIN)")


def unmount(path: Path) -> None:
    """Detach the tmpfs at ``path`` (its memory is freed once nothing uses it)."""
    _c().umount2(str(path).encode(), _MNT_DETACH)


def disk_full(path: Path) -> bool:
    """Whether the file system at ``path`` has no free block or no free inode left."""
    with contextlib.suppress(OSError):
        st = os.statvfs(path)
        return st.f_bavail == 0 or st.f_favail == 0
    return False
