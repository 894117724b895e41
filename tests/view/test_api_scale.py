"""The API at scale: a 100,000-row index paged every way, and a 10,000-turn episode."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import aiohttp
import numpy as np

from tracewire.store import Run
from tracewire.view import ViewServer

from .builders import insert_sql, long_episode, padded, write_run
from .test_api import get_json

N_ROWS = 100_000


async def make_big_index(path: Path) -> tuple[Run, list[tuple[object, ...]]]:
    """A real run (its writer kept open), then 100,000 index rows inserted straight into its
    index.sqlite with the store's own schema and upsert statement. This is a shortcut for
    speed: the rows point at no records, so only the index endpoints are exercised with it.
    The writer stays open so no one can repair the run meanwhile (a repair rightly drops rows
    whose records do not exist; reading leaves them as they are)."""
    run = await Run.create(path, meta={"name": "big-index"}, fsync="never")
    rng = random.Random(0)
    rows: list[tuple[object, ...]] = []
    for i in range(N_ROWS):
        rows.append((
            f"ep{i:06d}", "big", rng.choice(["arith", "tools", "guess"]), f"task-{i % 5000:05d}",
            None, i % 4, rng.choice(["complete", "incomplete"]), 1,
            rng.choice(["done", "max_turns", None]), round(rng.random(), 4), "{}", "{}",
            rng.randint(1, 50), 0, 0, rng.randint(10, 10_000), 1, rng.choice([0, 0, 0, 2]),
            1000.0 + i, 1001.0 + i, 1.0, 1000.0 + i, 0, i * 100, 100, 0, i // 100, None, None,
        ))  # fmt: skip
    conn = sqlite3.connect(path / "index.sqlite")
    with conn:
        conn.executemany(insert_sql(), [padded(r) for r in rows])
    conn.close()
    return run, rows


async def test_100k_row_index_pages(tmp_path: Path) -> None:
    run, rows = await make_big_index(tmp_path / "big")
    ids = [str(r[0]) for r in rows]
    reward = np.array([r[9] for r in rows])
    env = [r[2] for r in rows]
    async with run, ViewServer(tmp_path / "big") as srv, aiohttp.ClientSession() as s:
        url = srv.url + "/api/episodes"
        page = await get_json(s, url)
        assert page["total"] == N_ROWS and [r["id"] for r in page["rows"]] == ids[:50]
        page = await get_json(s, url + "?offset=99990")
        assert [r["id"] for r in page["rows"]] == ids[99990:]
        page = await get_json(s, url + "?offset=100000")
        assert page["rows"] == [] and page["total"] == N_ROWS

        # Deep pages of an ordering with no SQL index behind it: by reward, then arrival.
        want = sorted(range(N_ROWS), key=lambda i: (-reward[i], -i))
        page = await get_json(s, url + "?sort=reward&order=desc&offset=50000&limit=50")
        assert [r["id"] for r in page["rows"]] == [ids[i] for i in want[50000:50050]]

        # Filters combined, paged to the end.
        sel = [i for i in range(N_ROWS)
               if env[i] == "tools" and 0.25 <= reward[i] <= 0.5 and rows[i][17] > 0]
        got: list[str] = []
        offset = 0
        while True:
            page = await get_json(
                s, f"{url}?env=tools&reward_min=0.25&reward_max=0.5&errors=true"
                   f"&limit=500&offset={offset}")
            assert page["total"] == len(sel)
            if not page["rows"]:
                break
            got += [r["id"] for r in page["rows"]]
            offset += 500
        assert got == [ids[i] for i in sel]

        page = await get_json(s, url + "?q=task-0421&sort=task_key&limit=500")
        want = sorted((str(r[3]), i) for i, r in enumerate(rows) if "task-0421" in str(r[3]))
        assert page["total"] == len(want) == 200
        assert [r["id"] for r in page["rows"]] == [ids[i] for _, i in want]
        stats = await get_json(s, srv.url + "/api/stats")
        assert stats["n"] == N_ROWS and sum(stats["hist"]["counts"]) == N_ROWS
        facets = await get_json(s, srv.url + "/api/facets")
        assert facets["env"] == ["arith", "guess", "tools"]

        # New rows appended while serving show up in the next page.
        conn = sqlite3.connect(tmp_path / "big" / "index.sqlite")
        with conn:
            conn.execute(insert_sql(), padded(("late", *rows[0][1:])))
        conn.close()
        page = await get_json(s, url + "?sort=arrival&order=desc&limit=1")
        assert page["total"] == N_ROWS + 1 and page["rows"][0]["id"] == "late"


async def test_10k_turn_episode(tmp_path: Path) -> None:
    ep = long_episode(10_000)
    tr = ep.traces[0]
    await write_run(tmp_path / "long", [ep])
    async with ViewServer(tmp_path / "long") as srv, aiohttp.ClientSession() as s:
        base = f"{srv.url}/api/episodes/{ep.id}"
        summary = await get_json(s, base)
        t0 = summary["traces"][0]
        assert t0["n_nodes"] == 20_001 and t0["n_calls"] == 10_000
        assert t0["leaves"] == [{"leaf": 20_000, "depth": 20_001, "n_tokens": len(tr.columns),
                                 "role": "assistant"}]
        page = await get_json(s, f"{base}/traces/0/branches/20000?offset=19990&limit=200")
        assert [n["index"] for n in page["nodes"]] == list(range(19990, 20001))
        assert page["nodes"][-1]["message"]["content"] == "answer to turn 9999"
        assert page["nodes"][-1]["end"] == len(tr.columns) and page["n_nodes"] == 20_001
        await get_json(s, f"{base}/traces/0/branches/20000?limit=2001", 400)
        timing = await get_json(s, f"{base}/traces/0/timing")
        assert len(timing["calls"]["start"]) == 10_000
        assert timing["calls"]["node"][-1] == 20_000
        body = await get_json(s, f"{base}/traces/0/branches/20000/tokens?start=79990"
                                 "&end=80100&format=json")
        assert body["ids"] == tr.columns.ids[79990:80001].tolist()
        assert body["total"] == len(tr.columns) == 80_001
