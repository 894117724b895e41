"""What checking every index row's checksum costs a reader, over a 100,000-row index.

``ours``: ``Run.index_since(0, <the viewer's columns>)`` (the viewer's cold load: whole rows
fetched, each ``row_crc`` checked, the columns projected), ``Run.rows()`` (IndexRow
objects) and ``Run.index_at`` of one 50-row page. ``baseline``: the same columns read with
one plain ``SELECT`` and no check, as the store read them before the checksum (for
``rows``, with the same ``IndexRow.from_sql`` conversion). CPU time of this process
(``time.process_time``), median of ``--runs``, so load from other processes on a shared
machine moves it less than wall time. Usage: ``python bench/index_read.py [--runs 5]``.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit
from tracewire.store import COLUMNS, ROW_CRC, IndexRow, Run, open_run, row_crc
from tracewire.view._index import NUMERIC, TEXT

N = 100_000


def cpu_ms(fn: Callable[[], Any], runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.process_time()
        fn()
        times.append((time.process_time() - t0) * 1e3)
    return statistics.median(times)


def fill(path: Path) -> None:
    rng = random.Random(0)
    rows = [(
        f"ep{i:06d}", "big", rng.choice(["arith", "tools"]), f"task-{i % 5000:05d}", None,
        i % 4, "complete", 1, "done", rng.random(), '{"correct":1.0}', '{"turns":3.0}', 3, 0,
        0, 100, 1, 0, 1000.0 + i, 1001.0 + i, 1.0, 1000.0 + i, 0, i * 100, 100, 0,
    ) for i in range(N)]  # fmt: skip
    padded = [r + (None,) * (len(COLUMNS) - len(r)) for r in rows]
    cols = [*COLUMNS, ROW_CRC]
    conn = sqlite3.connect(path / "index.sqlite")
    with conn:
        conn.executemany(
            f"INSERT INTO episodes ({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)})",
            [(*r, row_crc(r)) for r in padded])
    conn.close()


def main(runs: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="tw-index-read-"))
    try:
        run_dir = tmp / "r"

        async def create() -> None:
            async with await Run.create(run_dir, fsync="never"):
                pass

        asyncio.run(create())
        fill(run_dir)
        view_cols = ["seq", *NUMERIC, *TEXT]
        page = list(range(1, N, N // 50))
        plain = sqlite3.connect(f"{(run_dir / 'index.sqlite').as_uri()}?mode=ro", uri=True)
        select = ", ".join(f'"{c}"' for c in view_cols)
        all_cols = ", ".join(f'"{c}"' for c in COLUMNS)
        marks = ", ".join("?" for _ in page)
        with open_run(run_dir) as r:
            assert len(r.index_since(0, view_cols)) == N
            cases = [
                ("index_since_viewer_columns", lambda: r.index_since(0, view_cols),
                 lambda: plain.execute(f"SELECT {select} FROM episodes WHERE seq > 0 "
                                       "ORDER BY seq").fetchall()),
                ("rows_all", r.rows,
                 lambda: [IndexRow.from_sql(v) for v in plain.execute(
                     f"SELECT {all_cols} FROM episodes ORDER BY seq").fetchall()]),
                ("index_at_page_50", lambda: r.index_at(page, view_cols),
                 lambda: plain.execute(f"SELECT {select} FROM episodes WHERE seq IN ({marks})",
                                       page).fetchall()),
            ]
            for name, ours, base in cases:
                emit("index_read", name, "cpu_ms", "ms", cpu_ms(ours, runs),
                     cpu_ms(base, runs), "lower", runs)
        plain.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=5)
    main(ap.parse_args().runs)
