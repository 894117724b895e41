"""The RL views' part of ``bench/view.py``: groups of a 10,000-episode run, diffs of two
1,000-turn episodes, and the server loop's worst stall meanwhile.

``ours``: the request's wall time as the client sees it (``GET`` to last byte, loopback), the
server on its own loop thread. "cold" = the first request after the groups were dropped (the
group table is rebuilt from the index table) or, for diffs, with both episodes read from the
segment and decoded (pairs cycle through more episodes than the viewer caches); "warm" =
the same request again. ``baseline``: the same answer as SQL on the store's index
(``GROUP BY group_id`` for the list, ``WHERE group_id = ?`` for a page), which is what a
viewer without the in-memory table would run. The loop stall is the largest overshoot of a
1 ms sleep on the server's loop while all requests ran.
"""

from __future__ import annotations

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

from _common import emit, median_ms
from tracewire.store import COLUMNS, Run
from tracewire.trace import Episode, Message
from tracewire.view import ViewServer

N_EPISODES = 10_000
GROUP = 4
TURNS = 1_000


def _insert_sql() -> str:
    names = ", ".join(f'"{n}"' for n in COLUMNS)
    return f"INSERT OR REPLACE INTO episodes ({names}) VALUES ({', '.join('?' for _ in COLUMNS)})"


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
        rows.append(tuple(row[c] for c in COLUMNS))
    conn = sqlite3.connect(path / "index.sqlite")
    with conn:
        conn.executemany(_insert_sql(), rows)
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


async def main(runs: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        groups_dir, diff_dir = Path(tmp) / "groups", Path(tmp) / "diff"
        writer = await Run.create(groups_dir, meta={"name": "bench-groups"}, fsync="never")
        fill_groups(groups_dir)
        eps = [long_rollout(k, differ_at=900) for k in range(6)]
        drun = await Run.create(diff_dir, meta={"name": "bench-diff"}, fsync="never")
        for ep in eps:
            await drun.append(ep)
        await drun.close()
        lags: list[float] = []
        with ViewServer.run_in_thread(groups_dir) as gsrv, \
                ViewServer.run_in_thread(diff_dir) as dsrv:
            stop = [asyncio.Event(), asyncio.Event()]
            mons = [asyncio.run_coroutine_threadsafe(_lag_monitor(ev, lags), gsrv_loop(sv))
                    for ev, sv in zip(stop, (gsrv, dsrv), strict=True)]
            async with aiohttp.ClientSession() as s:
                await _group_cases(s, gsrv, groups_dir, runs)
                await _diff_cases(s, dsrv, eps, runs)
            for ev, sv in zip(stop, (gsrv, dsrv), strict=True):
                gsrv_loop(sv).call_soon_threadsafe(ev.set)
            for m in mons:
                m.result(timeout=10)
        await writer.close()
        emit("view", "rl_requests", "loop_max_lag_ms", "ms", max(lags), None, "lower",
             len(lags))
        emit("view", "rl_requests", "loop_p99_lag_ms", "ms",
             float(np.percentile(lags, 99)), None, "lower", len(lags))


def gsrv_loop(srv: ViewServer) -> asyncio.AbstractEventLoop:
    """The loop a ``run_in_thread`` server runs on."""
    assert srv.loop is not None
    return srv.loop


async def _group_cases(s: aiohttp.ClientSession, srv: ViewServer, path: Path, runs: int) -> None:
    groups = srv.source.groups
    conn = sqlite3.connect(f"file:{path / 'index.sqlite'}?mode=ro", uri=True)
    cases = {"list_first_page": "/api/groups",
             "list_mixed_by_spread_offset_1000": "/api/groups?spread=mixed&sort=spread&offset=1000",
             "page_of_one_group": "/api/groups/run%2F1%2Ftask-0421"}
    base_list = median_ms(lambda: _sql_groups(conn), runs)
    base_page = median_ms(lambda: _sql_group(conn, "run/1/task-0421"), runs)
    for case, url in cases.items():
        base = base_page if case.startswith("page") else base_list
        for mode in ("cold", "warm"):
            times = []
            for _ in range(runs):
                if mode == "cold":
                    groups.drop()
                times.append(await _wall(s, srv.url + url))
            emit("view", f"groups_10k_{case}", f"request_{mode}_ms", "ms",
                 statistics.median(times), base, "lower", runs)
    conn.close()


async def _diff_cases(s: aiohttp.ClientSession, srv: ViewServer, eps: list[Episode],
                      runs: int) -> None:
    pairs = [(eps[i].id, eps[i + 1].id) for i in range(0, len(eps), 2)]
    cold = [await _wall(s, f"{srv.url}/api/diff?a={a}&b={b}")
            for a, b in (pairs * runs)[: 3 * runs]]
    a, b = pairs[0]
    warm = [await _wall(s, f"{srv.url}/api/diff?a={a}&b={b}") for _ in range(runs)]
    emit("view", "diff_1000_turns", "request_cold_ms", "ms", statistics.median(cold), None,
         "lower", len(cold))
    emit("view", "diff_1000_turns", "request_warm_ms", "ms", statistics.median(warm), None,
         "lower", runs)


if __name__ == "__main__":
    sys.exit("run bench/view.py (this module is its RL part)")
