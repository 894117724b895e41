"""Reading never changes a run; ``Run.verify`` finds damage; ``Run.repair`` fixes what it can
and never deletes an intact record, even one this build cannot decode."""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import sqlite3
import struct
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from tracewire import StoreError
from tracewire.codec import encode_frames, frames_to_record
from tracewire.store import Run, open_run
from tracewire.trace import SCHEMA_VERSION

from .helpers import build, check


async def _make(path: Path, n: int = 6) -> list[str]:
    ids = []
    async with await Run.create(path, fsync="never") as run:
        for s in range(n):
            ep = build(s, turns=2, n=20, task_key=f"task-{s}")
            await run.append(ep)
            ids.append(ep.id)
    return ids


def _seg(path: Path) -> Path:
    return path / "segments" / "00000000.twr"


def _newer_schema_record(seed: int) -> bytes:
    """An intact record (CRCs hold) that a newer build wrote: its schema is too new here."""
    frames = encode_frames(build(seed, turns=1, n=8))
    first = bytearray(frames[0])
    struct.pack_into("<H", first, 2, SCHEMA_VERSION + 1)
    return b"".join(bytes(p) for p in frames_to_record([first, *frames[1:]]))


def _buggy_record() -> bytes:
    """An intact record whose header a buggy writer filled with a wrong type."""
    header = msgspec.msgpack.encode({"type": "episode", "id": 5, "traces": "x"})
    return b"".join(bytes(p) for p in frames_to_record([b"TW" + struct.pack("<H", 1) + header]))


def _append_bytes(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def _snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    # index.sqlite-shm is SQLite's shared-memory lock table, which every reader of a WAL
    # database updates by design; it holds no data (rebuilt from the WAL when missing).
    return {str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != "index.sqlite-shm"}


@pytest.mark.parametrize("make", [_newer_schema_record, _buggy_record], ids=["newer", "buggy"])
async def test_intact_undecodable_tail_is_never_truncated(tmp_path: Path, make: object) -> None:
    run_dir = tmp_path / "r"
    ids = await _make(run_dir)
    rec = make(99) if make is _newer_schema_record else make()  # type: ignore[operator]
    _append_bytes(_seg(run_dir), rec)
    size = _seg(run_dir).stat().st_size
    with open_run(run_dir) as r:
        report = r.verify()
    assert [p.kind for p in report.problems] == ["undecodable record"], report.text()
    assert not report.problems[0].repairable
    # A writer resuming the run recovers it: the record stays.
    async with await Run.create(run_dir, resume=True) as run:
        await run.append(build(50, turns=1, n=8))
    assert _seg(run_dir).stat().st_size > size
    assert _seg(run_dir).read_bytes()[size - len(rec): size] == rec
    fixed = Run.repair(run_dir)
    assert [p.kind for p in fixed.problems] == ["undecodable record"]
    assert _seg(run_dir).read_bytes()[size - len(rec): size] == rec
    with open_run(run_dir) as r:
        assert [x.episode_id for x in r.rows()][: len(ids)] == ids and len(r) == len(ids) + 1


async def _crashed_run(run_dir: Path) -> None:
    """A run as a killed writer leaves it: status running, a journal, a torn tail."""
    await _make(run_dir)
    meta = run_dir / "meta.json"
    meta.write_bytes(meta.read_bytes().replace(b'"status": "complete"', b'"status": "running"'))
    _append_bytes(_seg(run_dir), _seg(run_dir).read_bytes()[:100])  # a record, cut off
    (run_dir / "live" / ("0" * 32 + ".twj")).write_bytes(b"TWR1 torn journal")


async def test_reading_a_crashed_run_changes_no_file(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    await _crashed_run(run_dir)
    before = _snapshot(run_dir)
    with open_run(run_dir) as r:
        rows = r.rows()
        for row in rows:
            check(r.read(row.ref))
        r.live()
        report = r.verify()
        assert r.meta["status"] == "running"
    kinds = {p.kind for p in report.problems}
    assert {"torn tail", "not closed", "unrecovered journals"} <= kinds, report.text()
    after = _snapshot(run_dir)
    assert after == before  # no file appears, none changes (bytes or mtime)


_READER = """
import sys
from tracewire.store import open_run
with open_run(sys.argv[1]) as r:
    rows = r.rows()
    eps = [r.read(x.ref).id for x in rows]
    rep = r.verify()
    print(len(rows), len(eps), sorted({p.kind for p in rep.problems}))
"""


def test_open_run_on_a_read_only_mount(tmp_path: Path) -> None:
    run_dir, mnt = tmp_path / "r", tmp_path / "ro"
    asyncio.run(_crashed_run(run_dir))
    mnt.mkdir()
    before = _snapshot(run_dir)
    if os.geteuid() == 0 and shutil.which("unshare"):
        # Root ignores permission bits: a read-only bind mount gives real read-only semantics.
        script = (f'mount --bind -o ro "{run_dir}" "{mnt}" && '
                  f'exec "{sys.executable}" -c "$0" "{mnt}"')
        cmd = ["unshare", "-m", "sh", "-c", script, _READER]
    else:
        for p in [run_dir, *run_dir.rglob("*")]:
            p.chmod(p.stat().st_mode & ~0o222)
        cmd = [sys.executable, "-c", _READER, str(run_dir)]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    finally:
        for p in [run_dir, *run_dir.rglob("*")]:
            p.chmod(p.stat().st_mode | 0o200)
    if "mount" in res.stderr and res.returncode != 0 and "Traceback" not in res.stderr:
        pytest.skip(f"cannot make a read-only bind mount here: {res.stderr.strip()[:200]}")
    assert res.returncode == 0, res.stderr
    n, m, kinds = res.stdout.split(" ", 2)
    assert n == m == "6"
    assert "torn tail" in kinds and "not closed" in kinds
    assert _snapshot(run_dir) == before


async def test_seeded_bit_flips_in_the_index_are_caught_or_raise_store_error(
    tmp_path: Path,
) -> None:
    base = tmp_path / "base"
    ids = await _make(base, n=20)
    with open_run(base) as r:
        truth = {(x.episode_id, x.task_key, x.reward) for x in r.rows()}
    assert {t[0] for t in truth} == set(ids)
    # Move every row into the main file, so the flips land on them (set-up only).
    conn = sqlite3.connect(base / "index.sqlite")
    conn.execute("PRAGMA journal_mode = DELETE")
    conn.close()
    assert not (base / "index.sqlite-wal").exists()
    index = (base / "index.sqlite").read_bytes()
    rng = random.Random(17)
    silent = caught = raised = 0
    for k in range(100):
        run_dir = tmp_path / f"f{k}"
        shutil.copytree(base, run_dir)
        data = bytearray(index)
        bit = rng.randrange(len(data) * 8)
        data[bit // 8] ^= 1 << (bit % 8)
        (run_dir / "index.sqlite").write_bytes(bytes(data))
        try:
            with open_run(run_dir) as r:
                try:
                    got = {(x.episode_id, x.task_key, x.reward) for x in r.rows()}
                except StoreError:
                    got = None
                    raised += 1
                report = r.verify()
        except StoreError:
            raised += 1
            got, report = None, None
        # Row checksums: a damaged row is a StoreError on read, never a different value.
        assert got is None or got == truth, f"flip {bit}: rows read back wrong, no error"
        if got is None:
            assert report is None or not report.ok, f"flip {bit}: read failed, check OK"
            caught += 1
        elif got == truth and report is not None and report.ok:
            silent += 1  # the flip hit bytes no row depends on (free space, padding)
        fixed = Run.repair(run_dir)
        assert fixed.ok, f"flip {bit}: {fixed.text()}"
        with open_run(run_dir) as r:
            assert {(x.episode_id, x.task_key, x.reward) for x in r.rows()} == truth
        shutil.rmtree(run_dir)
    assert raised > 0  # the flips did damage rows, and none of it went unnoticed
    print(f"bit flips: {raised} StoreError ({caught} also reported by check), "
          f"{silent} harmless")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tracewire", "check", *args],
                          capture_output=True, text=True, timeout=120)


def test_check_command_reports_and_repairs(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    asyncio.run(_crashed_run(run_dir))
    # A wrong value in one index row (a bit flip, or a hand edit): its checksum no longer
    # matches, and the check names the row and what its record says.
    conn = sqlite3.connect(run_dir / "index.sqlite")
    with conn:
        conn.execute("UPDATE episodes SET task_key = 'wrong', reward = 7.0 WHERE seq = 2")
    conn.close()
    res = _cli(str(run_dir))
    assert res.returncode == 1, res.stderr
    assert "damaged index row at seq 2:" in res.stdout
    assert "task_key='wrong' (record: 'task-1')" in res.stdout
    for kind in ("torn tail", "not closed", "unrecovered journals"):
        assert kind in res.stdout
    assert "--repair" in res.stderr
    res = _cli(str(run_dir), "--repair")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "OK" in res.stdout.splitlines()[0] and "repaired:" in res.stdout
    assert _cli(str(run_dir)).returncode == 0
    with open_run(run_dir) as r:
        assert r.rows()[1].task_key == "task-1" and r.meta["status"] == "interrupted"
    assert _cli(str(tmp_path / "nothing")).returncode == 2
