"""A closed run is one self-contained index file; a damaged index row is an error, never a
silently different value; deleting the lock file never admits a second writer."""

from __future__ import annotations

import asyncio
import errno
import os
import random
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tracewire import StoreError
from tracewire.store import Run, open_run, remove_run

from .helpers import build, check


async def _make(path: Path, n: int) -> list[str]:
    ids = []
    async with await Run.create(path, fsync="never") as run:
        for s in range(n):
            ep = build(s, turns=2, n=20)
            ep.traces[0].metrics["score_of_the_turn"] = s / 7  # longer JSON to flip in
            await run.append(ep)
            ids.append(ep.id)
    return ids


_READER = """
import sys
from tracewire.store import open_run
with open_run(sys.argv[1]) as r:
    rows = r.rows()
    eps = [r.read(x.ref) for x in rows]
    print(len(rows), sum(len(e.traces[0].calls) for e in eps), len(r.index_since(0, ["seq"])))
"""


def _read_only(run_dir: Path) -> subprocess.CompletedProcess[str]:
    """Run ``_READER`` on ``run_dir`` through a read-only bind mount (root ignores mode
    bits), else with every write bit cleared."""
    mnt = run_dir.with_name(run_dir.name + "-ro")
    mnt.mkdir()
    if os.geteuid() == 0 and shutil.which("unshare"):
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
    return res


def _copy_without_sidecars(run_dir: Path, dest: Path) -> None:
    dest.mkdir()
    shutil.copy2(run_dir / "meta.json", dest / "meta.json")
    shutil.copy2(run_dir / "index.sqlite", dest / "index.sqlite")
    shutil.copytree(run_dir / "segments", dest / "segments")


async def test_a_closed_run_is_one_index_file_a_read_only_copy_reads_whole(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "r"
    await _make(run_dir, 30)
    assert not (run_dir / "index.sqlite-wal").exists()
    assert not (run_dir / "index.sqlite-shm").exists()
    with open_run(run_dir) as r:
        assert len(r.rows()) == 30
    # Reading created no side file either (the index is no longer in WAL mode).
    assert sorted(p.name for p in run_dir.iterdir()) == ["index.sqlite", "live", "lock",
                                                          "meta.json", "segments"]
    copy = tmp_path / "copy"
    _copy_without_sidecars(run_dir, copy)
    res = _read_only(copy)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["30", "60", "30"]
    # A resumed writer goes back to WAL and folds it in again when it closes.
    async with await Run.create(run_dir, resume=True) as run:
        await run.append(build(99, turns=1, n=8))
        assert (run_dir / "index.sqlite-wal").exists()
    assert not (run_dir / "index.sqlite-wal").exists()
    with open_run(run_dir) as r:
        assert len(r) == 31


async def test_closed_while_a_reader_holds_the_index_the_file_still_has_every_row(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "r"
    run = await Run.create(run_dir, fsync="never")
    with open_run(run_dir) as reader:  # another reader (a viewer) keeps the index open
        for s in range(12):
            await run.append(build(s, turns=1, n=8))
        assert len(reader.rows()) == 12
        await run.close()
        assert len(reader.rows()) == 12
    # WAL mode could not be left while the reader held the file, but it was emptied.
    wal = run_dir / "index.sqlite-wal"
    assert not wal.exists() or wal.stat().st_size == 0
    copy = tmp_path / "copy"
    _copy_without_sidecars(run_dir, copy)
    res = _read_only(copy)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["12", "12", "12"]


def _json_spans(index: bytes) -> list[int]:
    """Offsets of every byte of the rewards/metrics JSON texts stored in the file."""
    out: list[int] = []
    for start in (b'{"correct":', b'{"turns":'):
        at = index.find(start)
        while at >= 0:
            end = index.index(b"}", at)
            out.extend(range(at, end + 1))
            at = index.find(start, end)
    return out


async def test_seeded_flips_in_json_columns_are_errors_then_repairs_never_values(
    tmp_path: Path,
) -> None:
    base = tmp_path / "base"
    ids = await _make(base, 20)
    with open_run(base) as r:
        truth = [(x.episode_id, x.rewards, x.metrics) for x in r.rows()]
    assert [t[0] for t in truth] == ids
    index = (base / "index.sqlite").read_bytes()
    spans = _json_spans(index)
    assert len(spans) > 20 * 40  # every row's two JSON cells were found
    rng = random.Random(23)
    named = 0
    for k in range(100):
        run_dir = tmp_path / f"f{k}"
        shutil.copytree(base, run_dir)
        data = bytearray(index)
        pos = rng.choice(spans)
        data[pos] ^= 1 << rng.randrange(8)
        (run_dir / "index.sqlite").write_bytes(bytes(data))
        with open_run(run_dir) as r:
            with pytest.raises(StoreError) as err:
                r.rows()
            named += "index row seq" in str(err.value)
            with pytest.raises(StoreError):
                r.index_since(0, ["seq", "reward"])  # the viewer's path checks rows too
            with pytest.raises(StoreError):
                r.index()
            report = r.verify()
        assert [p.kind for p in report.problems] == ["damaged index row"], report.text()
        fixed = Run.repair(run_dir)
        assert fixed.ok, fixed.text()
        assert any("rewrote the index row" in a for a in fixed.repaired), fixed.repaired
        with open_run(run_dir) as r:
            # Rebuilt in place from the record: same rows, same arrival order.
            assert [(x.episode_id, x.rewards, x.metrics) for x in r.rows()] == truth
        shutil.rmtree(run_dir)
    # Even flips that break UTF-8 are read (with replacement characters) and fail their row's
    # checksum, so every error names the damaged row.
    assert named == 100, named


_HOLDER = """
import asyncio, sys
from tracewire.store import Run
async def main():
    run = await Run.create(sys.argv[1], fsync="never")
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    await run.close()
    print("closed", flush=True)
asyncio.run(main())
"""

_SECOND = """
import asyncio, sys
from tracewire import StoreError
from tracewire.store import Run
async def main():
    try:
        run = await Run.create(sys.argv[1], resume=True)
    except StoreError as exc:
        print("refused", exc.errno)
        return
    await run.close()
    print("admitted")
asyncio.run(main())
"""


def _second_writer(run_dir: Path) -> str:
    res = subprocess.run([sys.executable, "-c", _SECOND, str(run_dir)], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def test_deleting_the_lock_file_never_admits_a_second_writer(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(run_dir)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline().strip() == "ready"
        busy = f"refused {errno.EBUSY}"
        assert _second_writer(run_dir) == busy
        (run_dir / "lock").unlink()
        assert _second_writer(run_dir) == busy  # a second process
        with pytest.raises(StoreError, match="live writer"):  # and this one
            asyncio.run(Run.create(run_dir, resume=True))
        (run_dir / "lock").write_text("")  # a fresh file under the old name
        assert _second_writer(run_dir) == busy
        (run_dir / "lock").unlink()
        (run_dir / "lock").mkdir()  # even something that cannot be locked as a file
        assert _second_writer(run_dir) == busy
        (run_dir / "lock").rmdir()
        with open_run(run_dir) as r:
            assert r.layout.writer_alive()
        with pytest.raises(StoreError, match="live writer"):
            Run.repair(run_dir)
        with pytest.raises(StoreError, match="live writer"):
            remove_run(run_dir)
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "closed"
        assert holder.wait(timeout=60) == 0
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.communicate()  # reaps it and closes its pipes
    assert _second_writer(run_dir) == "admitted"
    with open_run(run_dir) as r:
        assert not r.layout.writer_alive() and r.verify().ok


async def test_a_second_writer_in_the_same_process_is_refused(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    async with await Run.create(run_dir) as run:
        (run_dir / "lock").unlink()
        with pytest.raises(StoreError) as err:
            await Run.create(run_dir, resume=True)
        assert err.value.errno == errno.EBUSY
        await run.append(build(1, turns=1, n=8))
    with open_run(run_dir) as r:
        check(r.read(r.rows()[0].ref))


def test_an_index_with_a_damaged_table_definition_is_rebuilt(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    ids = asyncio.run(_make(run_dir, 5))
    conn = sqlite3.connect(run_dir / "index.sqlite")
    conn.execute("PRAGMA writable_schema = ON")
    with conn:  # "reward REAL" -> "reward RFAL": integral rewards now read back as ints
        conn.execute("UPDATE sqlite_master SET sql = replace(sql, '\"reward\" REAL', "
                     "'\"reward\" RFAL') WHERE name = 'episodes'")
    conn.close()
    Run.repair(run_dir)  # rows rewritten in place still read back wrong: rebuilt
    with open_run(run_dir) as r:
        assert [x.episode_id for x in r.rows()] == ids and r.verify().ok


async def test_a_writer_of_an_older_build_locking_only_the_file_still_excludes(
    tmp_path: Path,
) -> None:
    import fcntl

    run_dir = tmp_path / "r"
    async with await Run.create(run_dir):
        pass
    fd = os.open(run_dir / "lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # what an older build's writer holds
        with pytest.raises(StoreError, match="live writer"):
            await Run.create(run_dir, resume=True)
        with open_run(run_dir) as r:
            assert r.layout.writer_alive()
    finally:
        os.close(fd)
    async with await Run.create(run_dir, resume=True) as run:
        await run.append(build(3, turns=1, n=8))
