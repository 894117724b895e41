"""Reading and writing a corpus directory: one gzipped file per corpus entry."""

from __future__ import annotations

import gzip
from pathlib import Path

__all__ = ["GOLDEN", "read_dir", "write_dir"]

#: The golden corpus (made from commit e666288; see its README).
GOLDEN = Path(__file__).resolve().parent / "golden" / "files"


def write_dir(corpus: dict[str, bytes], root: Path) -> None:
    """Write ``corpus`` under ``root`` gzipped (``mtime=0``: same input, same file), replacing
    whatever corpus files were there."""
    if root.exists():
        for p in root.rglob("*.gz"):
            p.unlink()
    for name, data in corpus.items():
        path = root / (name + ".gz")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(gzip.compress(data, compresslevel=9, mtime=0))


def read_dir(root: Path) -> dict[str, bytes]:
    """The corpus stored under ``root`` (the inverse of :func:`write_dir`)."""
    return {p.relative_to(root).as_posix()[:-3]: gzip.decompress(p.read_bytes())
            for p in sorted(root.rglob("*.gz"))}
