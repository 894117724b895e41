"""Reading while writing, journals and live episodes, exports, the loop lag probe."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pandas as pd
import polars as pl
import pytest

from tracewire import Episode
from tracewire.cli import main as cli_main
from tracewire.codec import decode_json
from tracewire.store import Run, open_run

from .helpers import add_turn, build, check

CHILD = str(Path(__file__).with_name("child_writer.py"))


def test_reader_tails_a_writer_in_another_process(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    with subprocess.Popen([sys.executable, CHILD, str(run_dir), "0", "30", "3", "3000",
                           "interval"], stdout=subprocess.PIPE, text=True) as child:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        r = open_run(run_dir)  # the writer holds the lock: no recovery, read only
        seen: list[str] = []
        while child.poll() is None or len(seen) < len(r):
            for row in r.rows()[len(seen):]:
                check(r.read(row.ref))
                seen.append(row.episode_id)
            time.sleep(0.01)
        out = child.stdout.read()
    acked = [x.split()[1] for x in out.splitlines() if x.startswith("acked")]
    assert seen[-len(acked):] == acked[-len(acked):] and len(seen) == 30
    assert r.meta["status"] == "complete"
    r.__exit__(None, None, None)


async def test_readers_in_threads_while_appending(tmp_path: Path) -> None:
    run = await Run.create(tmp_path / "r", fsync="never")
    stop = False

    def reader() -> int:
        n = 0
        with open_run(tmp_path / "r") as r:
            while not stop:
                for ep in r.episodes():
                    check(ep)
                    n += 1
        return n

    readers = [asyncio.create_task(asyncio.to_thread(reader)) for _ in range(2)]
    for s in range(30):
        await run.append(build(s, turns=2, n=500))
    stop = True
    counts = await asyncio.gather(*readers)
    assert all(c > 0 for c in counts)
    await run.close()


async def test_journal_live_and_deletion_after_append(tmp_path: Path) -> None:
    run = await Run.create(tmp_path / "r", fsync="always")
    ep = Episode(env="test", task_key="k", task={"seed": 5})
    ep.info.update(seed=5, n=20)
    ep.new_trace()
    journal = run.journal(ep)
    for k in range(3):
        add_turn(ep, 5, k, 20)
        ep.traces[0].set_pending([])  # preview-only notifications are not journaled
        ep.traces[0].notify()
    await run.flush()
    live = run.live()
    assert [e.id for e in live] == [ep.id]
    assert len(live[0].traces[0].calls) == 3
    check(live[0], complete=False)
    with open_run(tmp_path / "r") as reader:  # another reader sees it too
        assert [e.id for e in reader.live()] == [ep.id]
    ep.traces[0].stop = "done"
    await run.append(ep)
    assert journal.closed
    assert run.live() == []
    assert not list((tmp_path / "r" / "live").iterdir())
    await run.close()


async def test_open_journals_become_incomplete_episodes_on_reopen(tmp_path: Path) -> None:
    run = await Run.create(tmp_path / "r")
    ep = Episode(env="test", task_key="k", group_index=3, task={"seed": 9})
    ep.info.update(seed=9, n=50)
    ep.new_trace()
    run.journal(ep)
    for k in range(4):
        add_turn(ep, 9, k, 50)
        ep.traces[0].notify()
    done = build(1, 1, 10, task_key="k", group_index=0)
    await run.append(done)
    await run.close("interrupted")
    # Tear the journal's last record: recovery keeps the turns before it.
    jpath = next((tmp_path / "r" / "live").iterdir())
    data = jpath.read_bytes()
    jpath.write_bytes(data[:-5])
    with open_run(tmp_path / "r") as r:  # reading leaves the journal where it is
        assert [e.id for e in r.live()] == [ep.id] and not r.rows(status="incomplete")
        assert "unrecovered journals" in {p.kind for p in r.verify().problems}
    assert jpath.exists()
    assert Run.repair(tmp_path / "r").ok
    with open_run(tmp_path / "r") as r:
        rows = r.rows(status="incomplete")
        assert [x.episode_id for x in rows] == [ep.id]
        got = r.get(ep.id)
        assert got.info["incomplete"] is True
        assert len(got.traces[0].calls) == 3
        check(got, complete=False)
        assert r.completed_pairs() == {("k", 0)}
    assert not jpath.exists()


def test_export_import_round_trip_opens_everywhere(tmp_path: Path) -> None:
    async def make() -> list[Episode]:
        eps = [build(s, turns=2, n=30, task_key=f"k{s}") for s in range(4)]
        async with await Run.create(tmp_path / "r") as run:
            for e in eps:
                await run.append(e)
        return eps

    eps = asyncio.run(make())
    jl, pq = tmp_path / "x.jsonl", tmp_path / "x.parquet"
    assert cli_main(["export", str(tmp_path / "r"), "--format", "jsonl", "--out", str(jl)]) == 0
    assert cli_main(["export", str(tmp_path / "r"), "--format", "parquet", "--samples",
                     "--out", str(pq)]) == 0
    lines = jl.read_bytes().splitlines()
    assert [decode_json(x).id for x in lines] == [e.id for e in eps]
    assert cli_main(["import", str(jl), "--run", str(tmp_path / "back")]) == 0
    with open_run(tmp_path / "back") as back, open_run(tmp_path / "r") as orig:
        assert [r.episode_id for r in back.rows()] == [e.id for e in eps]
        for a, b in zip(orig.episodes(), back.episodes(), strict=True):
            assert (a.traces[0].columns.ids == b.traces[0].columns.ids).all()
            check(b)
    # pandas, polars and duckdb all open the exports.
    assert len(pd.read_json(jl, lines=True)) == 4
    assert pl.read_ndjson(jl).height == 4
    assert duckdb.sql(f"SELECT count(*) FROM read_json_auto('{jl}')").fetchall() == [(4,)]
    idx = pd.read_parquet(pq)
    assert list(idx["episode_id"]) == [e.id for e in eps]
    samples = tmp_path / "x.samples.parquet"
    assert pl.read_parquet(samples).height == 4
    got = duckdb.sql(f"SELECT sum(len(ids)), sum(n_tokens) FROM '{samples}'").fetchall()[0]
    assert got == (4 * 120, 4 * 120)
    assert pd.read_parquet(samples)["ids"].iloc[0].tolist() == \
        eps[0].traces[0].columns.ids.tolist()


def test_export_of_missing_run_fails_cleanly(tmp_path: Path) -> None:
    assert cli_main(["export", str(tmp_path / "none"), "--format", "jsonl"]) == 1
    assert cli_main(["import", str(tmp_path / "none.jsonl"), "--run", str(tmp_path / "x")]) == 1


@pytest.mark.parametrize("kind", ["pandas", "polars"])
async def test_index_frame_kinds(tmp_path: Path, kind: str) -> None:
    async with await Run.create(tmp_path / "r") as run:
        await run.append(build(1, 1, 5))
        frame = run.index(kind)
        assert len(frame) == 1
    with pytest.raises(ValueError):
        open_run(tmp_path / "r").index("arrow")
