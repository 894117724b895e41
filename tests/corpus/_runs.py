"""What every corpus case shares: the corpus type and a closed run's files.

Importing it installs ``_determinism`` (fixed clock, seeded ids), so a case module that
imports this first, and tracewire only inside its functions, always runs deterministic.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from . import _determinism as det

det.install()  # before tracewire is imported anywhere in this process

__all__ = ["Corpus", "det", "index_rows", "run_files"]

#: name -> bytes of one corpus file (names are paths inside the corpus directory).
Corpus = dict[str, bytes]


def index_rows(run_dir: Path) -> bytes:
    """The run's index rows as the store wrote them (every column, ``row_crc`` included)."""
    con = sqlite3.connect(f"file:{run_dir / 'index.sqlite'}?mode=ro", uri=True)
    try:
        cur = con.execute("SELECT * FROM episodes ORDER BY seq")
        names = [d[0] for d in cur.description]
        rows = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
    finally:
        con.close()
    return json.dumps(rows, indent=1, sort_keys=True).encode() + b"\n"


def run_files(prefix: str, run_dir: Path, out: Corpus) -> None:
    """A closed run's segment files (raw bytes) and index rows (JSON)."""
    for seg in sorted((run_dir / "segments").iterdir()):
        out[f"{prefix}/segments/{seg.name}"] = seg.read_bytes()
    out[f"{prefix}/index.json"] = index_rows(run_dir)
