"""Crash safety with real processes: kill -9 at random points, disk full, recovery."""

from __future__ import annotations

import asyncio
import os
import random
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import pytest

from tracewire import StoreError
from tracewire.store import Run, open_run

from .helpers import build, check

CHILD = str(Path(__file__).with_name("child_writer.py"))


def _spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, CHILD, *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def _verify(run_dir: Path, acked: set[str]) -> None:
    with open_run(run_dir) as r:
        rows = r.rows()
        ids = [row.episode_id for row in rows]
        assert len(ids) == len(set(ids)), "an episode is indexed twice"
        assert acked <= set(ids), f"lost acknowledged episodes: {acked - set(ids)}"
        for row in rows:
            ep = r.read(row.ref)  # CRC-checked; raises rather than return a corrupt record
            assert ep.id == row.episode_id
            check(ep, complete=row.status == "complete")
        assert len(r.rows(status="complete")) >= len(acked)


def _segment_bytes(run_dir: Path) -> int:
    return sum(p.stat().st_size for p in (run_dir / "segments").glob("*.twr"))


class _Lines:
    """Line reader over the zygote's stdout with a deadline (a raw fd and select, so a line
    that never comes fails the test with what was seen instead of hanging it)."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.fd = stream.fileno()
        self.buf = b""
        self.seen: list[str] = []

    def next(self, timeout: float = 30.0) -> list[str]:
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self.fd], [], [], max(0.0, left))
            if not ready:
                raise TimeoutError(f"no line from the zygote in {timeout} s; seen {self.seen[-8:]}")
            chunk = os.read(self.fd, 65536)
            if not chunk:
                raise EOFError(f"zygote closed its output; seen {self.seen[-8:]}")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        text = line.decode()
        self.seen.append(text)
        return text.split() or self.next(timeout)  # blank: see child_writer.zygote


def _full_ack(line: list[str]) -> bool:
    """An ``acked ID`` line printed whole (a writer killed mid-print leaves a torn one)."""
    return len(line) == 2 and line[0] == "acked" and len(line[1]) == 32 and all(
        c in "0123456789abcdef" for c in line[1])


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def _kill_at_random(zygote: subprocess.Popen[bytes], lines: _Lines, args: list[str],
                    rng: random.Random, acked: set[str]) -> None:
    """Start one writer (forked by the zygote), kill -9 it at a random point, collect acks."""
    assert zygote.stdin is not None
    zygote.stdin.write((" ".join(args) + "\n").encode())
    zygote.stdin.flush()
    head = lines.next()
    assert head[0] == "pid", head
    pid = int(head[1])
    assert lines.next() == ["ready"]
    wanted, got = rng.randrange(0, 4), 0
    while got < wanted:
        line = lines.next()
        assert line and line[0] != "exit", "writer ended early"
        if _full_ack(line):
            acked.add(line[1])
            got += 1
    time.sleep(rng.random() * 0.02)
    os.kill(pid, signal.SIGKILL)
    # Acks printed before the kill still count: they were durable when printed.
    while True:
        try:
            line = lines.next(timeout=10.0)
        except TimeoutError:
            # Rarely the zygote's "exit" line never arrives although the writer is dead;
            # what this test checks is durability, so go on once the process is gone.
            assert _gone(pid), f"writer {pid} survived SIGKILL"
            return
        if line[0] == "exit":
            assert int(line[2]) == signal.SIGKILL  # raw wait status: killed by SIGKILL
            return
        if _full_ack(line):
            acked.add(line[1])


def test_kill_9_at_random_points_loses_nothing_acknowledged(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    rng = random.Random(1234)
    acked: set[str] = set()
    seed = 0
    iterations = 60
    with subprocess.Popen([sys.executable, CHILD, "--zygote"], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, bufsize=0) as zygote:
        assert zygote.stdout is not None
        lines = _Lines(zygote.stdout)
        for it in range(iterations):
            args = [str(run_dir), str(seed), "40", str(rng.choice([1, 4, 8])),
                    str(rng.choice([200, 3000, 20000])), "always"]
            if it % 3 == 0:
                args.append("--journal")
            _kill_at_random(zygote, lines, args, rng, acked)
            seed += 40
            if it % 10 == 9:
                _verify(run_dir, acked)
        assert zygote.stdin is not None
        zygote.stdin.close()
    assert len(acked) > iterations // 2  # the kills landed at varied points, acks included
    _verify(run_dir, acked)  # read as it is: the last writer's leftovers are not touched
    with open_run(run_dir) as r:
        assert r.meta["status"] == "running"
        before = r.verify()
    assert not before.ok and {p.kind for p in before.problems} >= {"not closed"}
    after = Run.repair(run_dir)
    assert after.ok, after.text()
    _verify(run_dir, acked)
    with open_run(run_dir) as r:
        assert r.meta["status"] == "interrupted"
        assert r.live() == []  # every journal was recovered or dropped
        assert not list((run_dir / "live").glob("*.twj"))
        assert r.rows(status="incomplete"), "no in-flight journal was ever recovered"


def test_torn_tail_is_truncated_and_rows_rebuilt(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    with _spawn(str(run_dir), "0", "5", "2", "100", "always") as child:
        out, err = child.communicate(timeout=60)
    assert child.returncode == 0, err
    acked = {line.split()[1] for line in out.splitlines() if line.startswith("acked")}
    assert len(acked) == 5
    # Lose the index entirely and tear the tail (half of a record appended by hand).
    seg = run_dir / "segments" / "00000000.twr"
    data = seg.read_bytes()
    with open(seg, "ab") as f:
        f.write(data[: len(data) // 7])
    for name in ("index.sqlite", "index.sqlite-wal", "index.sqlite-shm"):
        (run_dir / name).unlink(missing_ok=True)
    with open_run(run_dir) as r:  # a reader sees an empty index and changes nothing
        assert len(r) == 0
        report = r.verify()
    assert seg.stat().st_size == len(data) + len(data) // 7
    kinds = [p.kind for p in report.problems]
    assert kinds.count("unindexed record") == 5 and "torn tail" in kinds, report.text()
    assert not (run_dir / "index.sqlite").exists()
    fixed = Run.repair(run_dir)
    assert fixed.ok, fixed.text()
    _verify(run_dir, acked)
    assert seg.stat().st_size == len(data)


def test_damage_in_the_middle_skips_only_the_damaged_record(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    with _spawn(str(run_dir), "0", "4", "2", "100", "always") as child:
        child.communicate(timeout=60)
    with open_run(run_dir) as r:
        rows = r.rows()
        victim = rows[1]
        seg = run_dir / "segments" / f"{victim.segment:08d}.twr"
        with open(seg, "r+b") as f:
            f.seek(victim.offset + victim.length - 100)
            f.write(b"\xff" * 10)
        with pytest.raises(StoreError):  # CorruptRecordError: never a corrupt episode
            r.read(victim.ref)
        for row in rows[:1] + rows[2:]:
            check(r.read(row.ref))
    # Rebuilding the index skips the damaged record but keeps the ones after it.
    for name in ("index.sqlite", "index.sqlite-wal", "index.sqlite-shm"):
        (run_dir / name).unlink(missing_ok=True)
    report = Run.repair(run_dir)
    assert [p.kind for p in report.problems] == ["damaged bytes"], report.text()
    assert not report.problems[0].repairable
    with open_run(run_dir) as r:
        assert [x.episode_id for x in r.rows()] == [x.episode_id for x in rows[:1] + rows[2:]]


def test_disk_full_via_file_size_limit_raises_store_error(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    # RLIMIT_FSIZE makes writes past 2 MB fail with EFBIG, like a full disk for this file.
    with _spawn(str(run_dir), "0", "40", "4", "10000", "always", "--fsize", str(2 << 20)) as child:
        out, err = child.communicate(timeout=60)
    assert child.returncode == 0, err
    lines = out.splitlines()
    acked = {x.split()[1] for x in lines if x.startswith("acked")}
    errors = [x for x in lines if x.startswith("storeerror")]
    assert acked and errors, out
    assert "file size limit" in errors[0]
    size = _segment_bytes(run_dir)
    assert size <= 2 << 20
    _verify(run_dir, acked)
    with open_run(run_dir) as r:
        assert len(r) == len(acked)  # the failed appends left nothing behind


def _mount_tmpfs(where: Path, size: str) -> bool:
    where.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                         capture_output=True)
    return res.returncode == 0


def test_disk_full_on_a_tiny_tmpfs(tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    if not _mount_tmpfs(mnt, "3m"):
        pytest.skip("cannot mount a tmpfs here (needs root); the RLIMIT_FSIZE test covers it")
    try:
        asyncio.run(_fill(mnt))
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


async def _fill(mnt: Path) -> None:
    if True:
        run = await Run.create(mnt / "r", fsync="always")
        stored = []
        with pytest.raises(StoreError) as info:
            for s in range(100):
                ep = build(s, turns=4, n=10000)
                await run.append(ep)
                stored.append(ep.id)
        assert "no space" in str(info.value)
        await run.close()
        with open_run(mnt / "r") as r:
            assert [x.episode_id for x in r.rows()] == stored
            for ep in r.episodes():
                check(ep)


def test_permission_error_is_store_error(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    (run_dir / "meta.json").mkdir()  # cannot be read as a file, whoever we are
    with pytest.raises(StoreError):
        open_run(run_dir)
