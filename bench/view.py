"""Viewer bench: episode-table page queries over a 100,000-row run index.

``ours``: server time of ``GET /api/episodes`` (its ``Server-Timing`` header) on a running
ViewServer — in-memory columnar table, vectorized filter, cached lexsort, primary-key fetch
of the page. "cold" clears the cached ordering before each request (first request of a new
sort/filter); "warm" pages within an ordering. ``baseline``: the same page as one SQL query
on the store's index (``WHERE ... ORDER BY <col>, seq LIMIT 50 OFFSET k`` plus ``COUNT(*)``),
as a viewer paging SQLite directly would do it. The RL views (groups of a 10,000-episode
run, diffs of 1,000-turn episodes) are measured by ``--part rl`` (see ``rl_main``). Usage:
``python bench/view.py [--runs 5] [--part index|rl|all]``.
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
from typing import Any

import aiohttp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, median_ms
from tracewire.store import COLUMNS, ROW_CRC, Run, row_crc
from tracewire.trace import Episode, Message
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


# -- the RL views ---------------------------------------------------------------------------
# The RL views (--part rl): groups of a 10,000-episode run, diffs of two
# 1,000-turn episodes, and the server loop's worst stall meanwhile.
#
# ``ours``: the request's wall time as the client sees it (``GET`` to last byte, loopback;
# the client in another process), the server on its own loop thread. "cold" = the first
# request after the groups were dropped (the group table is rebuilt from the index table)
# or, for diffs, with both episodes read from the segment and decoded (pairs cycle through
# more episodes than the viewer caches); "warm" =
# the same request again. ``baseline``: the same answer as SQL on the store's index
# (``GROUP BY group_id`` for the list, ``WHERE group_id = ?`` for a page), which is what a
# viewer without the in-memory table would run. The loop stall is the largest overshoot of a
# 1 ms sleep on the server's loop while all requests ran; its baseline is the same monitor
# on the idle server just before (this machine's floor).

N_EPISODES = 10_000
GROUP = 4
TURNS = 1_000


def fill_groups(path: Path) -> None:
    """10,000 index rows in 2,500 groups of 4 (rewards 0 / 0.5 / 1), no records behind them."""
    rng = random.Random(0)
    rows = []
    for i in range(N_EPISODES):
        g = i // GROUP
        row: dict[str, Any] = {c: None for c in COLUMNS}
        row.update({
            "episode_id": f"ep{i:06d}", "run": "bench", "env": "arith",
            "task_key": f"task-{g % 1000:04d}", "group_id": f"run/{g // 1000}/task-{g % 1000:04d}",
            "group_index": i % GROUP, "status": "complete", "ok": 1, "stop": "done",
            "reward": rng.choice([0.0, 0.5, 1.0]), "rewards": '{"correct": 1.0}',
            "metrics": "{}", "turns": 3, "input_tokens": 0, "output_tokens": 40,
            "n_tokens": 200, "n_traces": 1, "errors": 0, "started": 1000.0 + i,
            "ended": 1001.0 + i, "duration": 1.0, "written": 1000.0 + i, "segment": 0,
            "offset": i * 100, "length": 100, "crc": 0, "step": g // 1000,
            "policy_version": g // 1000,
        })  # fmt: skip
        values = tuple(row[c] for c in COLUMNS)
        rows.append((*values, row_crc(values)))  # readers check every row's checksum
    conn = sqlite3.connect(path / "index.sqlite")
    with conn:
        conn.executemany(insert_sql(), rows)
    conn.close()


def long_rollout(k: int, differ_at: int) -> Episode:
    """A 1,000-turn rollout; answers carry 8 sampled tokens; pair member ``k % 2 == 1`` has
    one token changed in turn ``differ_at``."""
    rng = np.random.default_rng(k // 2)
    ep = Episode(env="long", task_key=f"long-{k // 2}", group_id=f"long-{k // 2}",
                 group_index=k % 2)
    tr = ep.new_trace()
    parent = tr.add_node(Message(role="system", content="long"), ids=[1, 2])
    for t in range(TURNS):
        u = tr.add_node(Message(role="user", content=f"turn {t}"), parent=parent,
                        ids=rng.integers(0, 500, 6))
        ids = rng.integers(0, 500, 8)
        text = f"answer {t}"
        if k % 2 and t == differ_at:
            ids[3] += 1
            text += " (other)"
        parent = tr.add_node(Message(role="assistant", content=text), parent=u, sampled=True,
                             ids=ids, logprobs=-rng.random(8).astype(np.float32))
    tr.stop = "done"
    return ep


async def _wall(s: aiohttp.ClientSession, url: str) -> float:
    t0 = time.perf_counter()
    async with s.get(url) as r:
        assert r.status == 200, await r.text()
        await r.read()
    return (time.perf_counter() - t0) * 1e3


class RemoteClient:
    """An HTTP client in another process (``view.py --client``), so its parsing never holds
    this process's GIL while the server's loop is watched: one URL per line in, one wall
    time in ms per line out."""

    async def __aenter__(self) -> RemoteClient:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--client", stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        await self.proc.wait()

    async def get(self, url: str) -> float:
        """Wall time of ``GET url`` as the other process saw it."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(url.encode() + b"\n")
        await self.proc.stdin.drain()
        return float((await self.proc.stdout.readline()).decode())


async def client_main() -> None:
    """The ``--client`` side of :class:`RemoteClient`."""
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession() as s:
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            print(f"{await _wall(s, line.strip()):.4f}", flush=True)


async def _lag_monitor(stop: asyncio.Event, out: list[float]) -> None:
    while not stop.is_set():
        t0 = time.perf_counter()
        await asyncio.sleep(0.001)
        out.append((time.perf_counter() - t0) * 1e3 - 1.0)


def _sql_groups(conn: sqlite3.Connection) -> None:
    conn.execute("SELECT group_id, COUNT(*), AVG(reward), MIN(reward), MAX(reward), MIN(seq) "
                 "FROM episodes GROUP BY group_id ORDER BY MIN(seq) LIMIT 50").fetchall()
    conn.execute("SELECT COUNT(DISTINCT group_id) FROM episodes").fetchall()


def _sql_group(conn: sqlite3.Connection, gid: str) -> None:
    conn.execute("SELECT * FROM episodes WHERE group_id = ? ORDER BY reward DESC",
                 (gid,)).fetchall()


async def rl_main(runs: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        groups_dir, diff_dir = Path(tmp) / "groups", Path(tmp) / "diff"
        writer = await Run.create(groups_dir, meta={"name": "bench-groups"}, fsync="never")
        fill_groups(groups_dir)
        eps = [long_rollout(k, differ_at=900) for k in range(6)]
        drun = await Run.create(diff_dir, meta={"name": "bench-diff"}, fsync="never")
        for ep in eps:
            await drun.append(ep)
        await drun.close()
        # The SQL baselines first: median_ms collects garbage, which stops every thread.
        conn = sqlite3.connect(f"file:{groups_dir / 'index.sqlite'}?mode=ro", uri=True)
        bases = (median_ms(lambda: _sql_groups(conn), runs),
                 median_ms(lambda: _sql_group(conn, "run/1/task-0421"), runs))
        conn.close()
        for name, srv_dir in (("groups", groups_dir), ("diff", diff_dir)):
            floor: list[float] = []
            lags: list[float] = []
            with ViewServer.run_in_thread(srv_dir) as srv:
                # The same monitor on the idle server first: this machine's floor.
                stop = asyncio.Event()
                mon = asyncio.run_coroutine_threadsafe(_lag_monitor(stop, floor), gsrv_loop(srv))
                await asyncio.sleep(1.5)
                gsrv_loop(srv).call_soon_threadsafe(stop.set)
                mon.result(timeout=10)
                stop = asyncio.Event()
                mon = asyncio.run_coroutine_threadsafe(_lag_monitor(stop, lags), gsrv_loop(srv))
                async with RemoteClient() as s:
                    if name == "groups":
                        await _group_cases(s, srv, bases, runs)
                    else:
                        await _diff_cases(s, srv, eps, runs)
                gsrv_loop(srv).call_soon_threadsafe(stop.set)
                mon.result(timeout=10)
            emit("view", f"{name}_requests", "loop_max_lag_ms", "ms", max(lags), max(floor),
                 "lower", len(lags))
            emit("view", f"{name}_requests", "loop_p99_lag_ms", "ms",
                 float(np.percentile(lags, 99)), float(np.percentile(floor, 99)), "lower",
                 len(lags))
        await writer.close()


def gsrv_loop(srv: ViewServer) -> asyncio.AbstractEventLoop:
    """The loop a ``run_in_thread`` server runs on."""
    assert srv.loop is not None
    return srv.loop


async def _group_cases(s: RemoteClient, srv: ViewServer, bases: tuple[float, float],
                       runs: int) -> None:
    groups = srv.source.groups
    cases = {"list_first_page": "/api/groups",
             "list_mixed_by_spread_offset_1000": "/api/groups?spread=mixed&sort=spread&offset=1000",
             "page_of_one_group": "/api/groups/run%2F1%2Ftask-0421"}
    base_list, base_page = bases
    for case, url in cases.items():
        base = base_page if case.startswith("page") else base_list
        for mode in ("cold", "warm"):
            times = []
            for _ in range(runs):
                if mode == "cold":
                    groups.drop()
                times.append(await s.get(srv.url + url))
            emit("view", f"groups_10k_{case}", f"request_{mode}_ms", "ms",
                 statistics.median(times), base, "lower", runs)


async def _diff_cases(s: RemoteClient, srv: ViewServer, eps: list[Episode],
                      runs: int) -> None:
    pairs = [(eps[i].id, eps[i + 1].id) for i in range(0, len(eps), 2)]
    cold = [await s.get(f"{srv.url}/api/diff?a={a}&b={b}")
            for a, b in (pairs * runs)[: 3 * runs]]
    a, b = pairs[0]
    warm = [await s.get(f"{srv.url}/api/diff?a={a}&b={b}") for _ in range(runs)]
    emit("view", "diff_1000_turns", "request_cold_ms", "ms", statistics.median(cold), None,
         "lower", len(cold))
    emit("view", "diff_1000_turns", "request_warm_ms", "ms", statistics.median(warm), None,
         "lower", runs)



if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--part", choices=("index", "rl", "all"), default="all",
                    help="index: episode-table pages; rl: groups and diffs (see rl_main)")
    ap.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.client:
        asyncio.run(client_main())
        sys.exit(0)
    if args.part in ("index", "all"):
        asyncio.run(main(args.runs))
    if args.part in ("rl", "all"):
        asyncio.run(rl_main(args.runs))
