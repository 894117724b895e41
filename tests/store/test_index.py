"""Index columns: trainer bookkeeping (step, policy_version), appended columns on an older
index, and the row API the viewer reads through (index_head / index_since / index_at)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tracewire import StoreError
from tracewire.store import COLUMNS, Run, open_run

from .helpers import build


async def test_step_and_policy_version_come_from_episode_info(tmp_path: Path) -> None:
    eps = [build(s, turns=1, n=8) for s in range(4)]
    eps[0].info.update(step=3, policy_version=7)
    eps[1].info.update(step="3", policy_version=True)  # not ints: read as absent
    eps[2].info.update(step=2**63)  # msgpack holds it, SQLite's INTEGER does not: absent
    async with await Run.create(tmp_path / "r") as run:
        for ep in eps[:3]:
            await run.append(ep)
        bad = build(9, turns=1, n=8)
        bad.info["step"] = 2**70  # msgpack cannot hold it: a typed error, the writer goes on
        with pytest.raises(StoreError, match="cannot store the episode"):
            await run.append(bad)
        from tracewire.codec import encode_frames

        eps[3].info.update(step=11)
        await run.append_frames(encode_frames(eps[3]))  # the light header path
    with open_run(tmp_path / "r") as r:
        got = [(x.step, x.policy_version) for x in r.rows()]
        assert got == [(3, 7), (None, None), (None, None), (11, None)]
        assert [x.episode_id for x in r.rows(step=3)] == [eps[0].id]
        assert r.verify().ok


async def test_an_index_without_the_appended_columns_still_opens(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    old = build(1, turns=1, n=8)
    old.info["step"] = 5
    async with await Run.create(run_dir) as run:
        await run.append(old)
    # Turn the index into one an older build wrote (before the appended columns existed).
    conn = sqlite3.connect(run_dir / "index.sqlite")
    with conn:
        conn.execute("ALTER TABLE episodes DROP COLUMN step")
        conn.execute("ALTER TABLE episodes DROP COLUMN policy_version")
        conn.execute("ALTER TABLE episodes DROP COLUMN tito_mismatch")
        conn.execute("ALTER TABLE episodes DROP COLUMN row_crc")
    conn.close()
    with open_run(run_dir) as r:
        assert [(x.episode_id, x.step) for x in r.rows()] == [(old.id, None)]
        assert r.index_since(0, ["seq", "step", "task_key"]) == [(1, None, old.task_key)]
    new = build(2, turns=1, n=8)
    new.info["policy_version"] = 9
    async with await Run.create(run_dir, resume=True) as run:  # the writer adds the columns
        await run.append(new)
    conn = sqlite3.connect(run_dir / "index.sqlite")
    names = [r[1] for r in conn.execute("PRAGMA table_info(episodes)")]
    conn.close()
    assert names[1:] == [*COLUMNS, "row_crc"]
    with open_run(run_dir) as r:
        assert [(x.step, x.policy_version) for x in r.rows()] == [(None, None), (None, 9)]
        report = r.verify()  # the old row lacks the step its record holds: a repair adds it
    assert [p.kind for p in report.problems] == ["wrong index row"], report.text()
    assert Run.repair(run_dir).ok
    with open_run(run_dir) as r:
        assert [x.step for x in r.rows()] == [5, None]


async def test_rows_of_an_index_without_checksums_get_them_when_a_writer_resumes(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "r"
    eps = [build(s, turns=1, n=8) for s in range(3)]
    async with await Run.create(run_dir) as run:
        for ep in eps:
            await run.append(ep)
    conn = sqlite3.connect(run_dir / "index.sqlite")
    with conn:
        conn.execute("ALTER TABLE episodes DROP COLUMN row_crc")  # as a build before it
    conn.close()
    with open_run(run_dir) as r:  # opens; its rows cannot be checked, only read
        assert [x.episode_id for x in r.rows()] == [e.id for e in eps]
        assert r.verify().ok
    async with await Run.create(run_dir, resume=True) as run:
        await run.append(build(9, turns=1, n=8))
    conn = sqlite3.connect(run_dir / "index.sqlite")
    with conn:
        conn.execute("UPDATE episodes SET reward = 0.25 WHERE seq = 1")  # an old row
    conn.close()
    with open_run(run_dir) as r:
        with pytest.raises(StoreError, match=r"index row seq 1 .* does not match its checksum"):
            r.rows()
        with pytest.raises(StoreError, match="seq 1"):
            r.index_since(0, ["seq", "reward"])
        assert r.index_since(1, ["seq"]) == [(2,), (3,), (4,)]  # the other rows still read
    assert Run.repair(run_dir).ok
    with open_run(run_dir) as r:
        assert [x.reward for x in r.rows()] == [float(s % 2) for s in (0, 1, 2, 9)]


async def test_index_head_since_and_at(tmp_path: Path) -> None:
    eps = [build(s, turns=1, n=8, task_key=f"k{s}") for s in range(5)]
    async with await Run.create(tmp_path / "r") as run:
        for ep in eps:
            await run.append(ep)
        with open_run(tmp_path / "r") as r:
            assert r.index_head() == 5 and len(r) == 5
            assert r.index_since(3, ["seq", "task_key"]) == [(4, "k3"), (5, "k4")]
            assert sorted(r.index_at([5, 1, 99], ["task_key", "seq"])) == [("k0", 1),
                                                                          ("k4", 5)]
            with pytest.raises(ValueError, match="unknown index column"):
                r.index_since(0, ["seq", "nope; DROP TABLE episodes"])
            await run.append(build(0, turns=1, n=8, task_key="k0-again"))
            assert r.index_head() == 6 and len(r) == 6
