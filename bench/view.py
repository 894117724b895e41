"""Viewer bench: episode-table page queries over a 100,000-row run index.

``ours``: server time of ``GET /api/episodes`` (its ``Server-Timing`` header) on a running
ViewServer — in-memory columnar table, vectorized filter, cached lexsort, primary-key fetch
of the page. "cold" clears the cached ordering before each request (first request of a new
sort/filter); "warm" pages within an ordering. ``baseline``: the same page as one SQL query
on the store's index (``WHERE ... ORDER BY <col>, seq LIMIT 50 OFFSET k`` plus ``COUNT(*)``),
as a viewer paging SQLite directly would do it. Usage: ``python bench/view.py [--runs 5]``.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, median_ms
from tracewire.store import COLUMNS, ROW_CRC, Run, row_crc
from tracewire.view import ViewServer

N = 100_000
CASES = {
    # name: (query string, SQL where, SQL order)
    "arrival_first_page": ("offset=0", "", "seq ASC"),
    "arrival_last_page": ("offset=99950", "", "seq ASC"),
    "reward_desc_offset_50000": ("sort=reward&order=desc&offset=50000",
                                 "", "reward DESC, seq DESC"),
    "task_key_offset_70000": ("sort=task_key&offset=70000", "", "task_key ASC, seq ASC"),
    "filter_env_reward_errors": (
        "env=tools&reward_min=0.2&reward_max=0.6&errors=true&sort=n_tokens&offset=1000",
        "WHERE env='tools' AND reward>=0.2 AND reward<=0.6 AND errors>0",
        "n_tokens ASC, seq ASC"),
    "search_task_key": ("q=task-012&sort=reward&offset=0",
                        "WHERE task_key LIKE '%task-012%'", "reward ASC, seq ASC"),
}  # fmt: skip


def insert_sql() -> str:
    """Upsert of one index row in the run's ``index.sqlite`` (table ``episodes``), built from
    the store's public column list; a bench shortcut that writes no records."""
    cols = [*COLUMNS, ROW_CRC]
    names = ", ".join(f'"{n}"' for n in cols)
    return f"INSERT OR REPLACE INTO episodes ({names}) VALUES ({', '.join('?' for _ in cols)})"


def fill(path: Path) -> None:
    rng = random.Random(0)
    rows = [(
        f"ep{i:06d}", "big", rng.choice(["arith", "tools", "guess"]), f"task-{i % 5000:05d}",
        None, i % 4, rng.choice(["complete", "incomplete"]), 1,
        rng.choice(["done", "max_turns", None]), rng.random(), "{}", "{}", rng.randint(1, 50),
        0, 0, rng.randint(10, 10_000), 1, rng.choice([0, 0, 0, 2]), 1000.0 + i, 1001.0 + i,
        1.0, 1000.0 + i, 0, i * 100, 100, 0, None, None) for i in range(N)]  # fmt: skip
    conn = sqlite3.connect(path / "index.sqlite")
    with conn:
        # Columns added after these rows were written down are left null; readers check
        # each row's checksum.
        padded = [r + (None,) * (len(COLUMNS) - len(r)) for r in rows]
        conn.executemany(insert_sql(), [(*r, row_crc(r)) for r in padded])
    conn.close()


def sql_page(conn: sqlite3.Connection, where: str, order: str, offset: int) -> None:
    conn.execute(f"SELECT * FROM episodes {where} ORDER BY {order} LIMIT 50 OFFSET {offset}"
                 ).fetchall()
    conn.execute(f"SELECT COUNT(*) FROM episodes {where}").fetchall()


async def main(runs: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "run"
        # Index rows inserted directly with the store's schema (fast; no records behind
        # them). The writer stays open so nobody repairs them away meanwhile.
        run = await Run.create(path, meta={"name": "bench"}, fsync="never")
        fill(path)
        async with run, ViewServer(path) as srv, aiohttp.ClientSession() as s:
            table = srv.source.index
            t0 = time.perf_counter()
            table.reload()
            emit("view", "index_100k", "table_load_ms", "ms",
                 (time.perf_counter() - t0) * 1e3, None, "lower", 1)
            conn = sqlite3.connect(f"file:{path / 'index.sqlite'}?mode=ro", uri=True)
            for case, (qs, where, order) in CASES.items():
                offset = int(qs.split("offset=")[1].split("&")[0])
                base = median_ms(lambda w=where, o=order, k=offset: sql_page(conn, w, o, k), runs)
                for mode in ("cold", "warm"):
                    times = []
                    for _ in range(runs):
                        if mode == "cold":
                            table.drop_orderings()
                        async with s.get(f"{srv.url}/api/episodes?{qs}&limit=50") as r:
                            assert r.status == 200, await r.text()
                            await r.read()
                            times.append(float(r.headers["Server-Timing"].split("dur=")[1]))
                    emit("view", f"index_100k_{case}", f"page_{mode}_ms", "ms",
                         statistics.median(times), base, "lower", runs)
            conn.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    asyncio.run(main(ap.parse_args().runs))
