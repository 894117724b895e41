"""Moving files in and out of a workdir the agent controls: relative paths only, and no
path component may be a link (the agent could plant one pointing at the host)."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath

from ._errors import SandboxError, check_size

__all__ = ["read_files", "write_files"]


def _parts(rel: str) -> list[str]:
    p = PurePosixPath(rel)
    if p.is_absolute() or not p.parts or any(x in ("..", "") for x in p.parts):
        raise SandboxError(f"file path must be relative and inside the workdir: {rel!r}")
    return [x for x in p.parts if x != "."]


def _open_dir(root: Path, parts: Sequence[str], create: bool) -> int:
    """An fd of ``root/parts...`` reached without following any link."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        for name in parts:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o755, dir_fd=fd)
            nxt = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_files(root: Path, files: Mapping[str, bytes | str], limit: int) -> None:
    """Write each file under ``root`` (parents made as needed)."""
    for rel, content in files.items():
        data = content.encode() if isinstance(content, str) else content
        check_size(len(data), limit, rel)
        *dirs, name = _parts(rel)
        try:
            dfd = _open_dir(root, dirs, create=True)
            try:
                fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW,
                             0o644, dir_fd=dfd)
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
            finally:
                os.close(dfd)
        except OSError as exc:
            raise SandboxError(f"cannot write {rel!r} into the workdir: {exc}") from exc


def read_files(root: Path, paths: Sequence[str], limit: int) -> dict[str, bytes]:
    """Read regular files under ``root``; missing ones are left out."""
    out: dict[str, bytes] = {}
    for rel in paths:
        *dirs, name = _parts(rel)
        try:
            dfd = _open_dir(root, dirs, create=False)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise SandboxError(f"cannot read {rel!r}: {exc}") from exc
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise SandboxError(f"cannot read {rel!r}: {exc}") from exc
        finally:
            os.close(dfd)
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise SandboxError(f"{rel!r} is not a regular file")
            check_size(st.st_size, limit, rel)
            out[rel] = f.read(limit + 1)
            check_size(len(out[rel]), limit, rel)
    return out
