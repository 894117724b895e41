"""Appending: ordering, cancellation, frames as they are, encoding, rolling, policies."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tracewire import StoreError
from tracewire.codec import encode_frames, record_bytes
from tracewire.store import RecordRef, Run, open_run
from tracewire.store._encode import episode_parts

from .helpers import build, check


@pytest.mark.parametrize("fsync", ["always", "interval", "never"])
async def test_concurrent_appends_keep_arrival_order(tmp_path: Path, fsync: str) -> None:
    run = await Run.create(tmp_path / "r", fsync=fsync, max_queued=4)
    eps = [build(s, turns=1 + s % 5, n=50 + 300 * (s % 3)) for s in range(40)]
    refs = await asyncio.gather(*(run.append(e) for e in eps))
    offsets = [(r.segment, r.offset) for r in refs]
    assert offsets == sorted(offsets)
    assert [r.episode_id for r in run.rows()] == [e.id for e in eps]
    await run.close()
    with open_run(tmp_path / "r") as r:
        assert [e.id for e in r.episodes()] == [e.id for e in eps]
        for e in r.episodes():
            check(e)
        assert r.meta["status"] == "complete"


async def test_cancelled_append_leaves_whole_record_or_none(tmp_path: Path) -> None:
    run = await Run.create(tmp_path / "r", fsync="always")
    eps = [build(s, turns=20, n=2000) for s in range(6)]
    tasks = [asyncio.create_task(run.append(e)) for e in eps]
    await asyncio.sleep(0)
    for t in tasks[1::2]:
        t.cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert any(isinstance(x, asyncio.CancelledError) for x in results)
    after = build(100, turns=2, n=10)
    await run.append(after)  # the writer is still healthy
    await run.close()
    with open_run(tmp_path / "r") as r:
        ids = [row.episode_id for row in r.rows()]
        # Cancelling a caller never un-appends nor tears: every record is whole.
        assert ids == [e.id for e in eps] + [after.id]
        for e in r.episodes():
            check(e)


async def test_append_frames_persists_bytes_as_received(tmp_path: Path) -> None:
    ep = build(7, turns=3, n=100)
    frames = [bytes(f) for f in encode_frames(ep)]
    run = await Run.create(tmp_path / "r")
    ref = await run.append_frames(frames)
    await run.close()
    with open_run(tmp_path / "r") as r:
        seg = (tmp_path / "r" / "segments" / "00000000.twr").read_bytes()
        assert seg[ref.offset : ref.offset + ref.length] == record_bytes(ep)
        row = r.rows()[0]
        assert (row.episode_id, row.turns, row.n_tokens) == (ep.id, 3, 600)
        assert row.reward == 1.0 and row.rewards == {"correct": 1.0}
        check(r.get(ep.id))


async def test_append_frames_rejects_non_episode(tmp_path: Path) -> None:
    ep = build(7, turns=1, n=5)
    run = await Run.create(tmp_path / "r")
    with pytest.raises(ValueError):
        await run.append_frames(encode_frames(ep.traces[0]))
    await run.append(ep)  # still writable
    await run.close()
    assert len(open_run(tmp_path / "r")) == 1


@pytest.mark.parametrize("turns", [0, 1, 200, 700])
def test_sliced_encoding_equals_codec_record(turns: int) -> None:
    ep = build(turns, turns=turns, n=3)
    ep.traces[0].add_error("boom", "x")
    assert b"".join(bytes(memoryview(p)) for p in episode_parts(ep)) == record_bytes(ep)


async def test_segments_roll_at_the_size_limit(tmp_path: Path) -> None:
    run = await Run.create(tmp_path / "r", segment_bytes=100_000)
    eps = [build(s, turns=2, n=5000) for s in range(8)]  # ~90 kB each
    for e in eps:
        await run.append(e)
    await run.close()
    with open_run(tmp_path / "r") as r:
        segs = {row.segment for row in r.rows()}
        assert len(segs) == 8
        assert [e.id for e in r.episodes()] == [e.id for e in eps]


async def test_index_rows_filters_and_frames(tmp_path: Path) -> None:
    run = await Run.create(tmp_path / "r", meta={"model": "m"})
    for s in range(6):
        await run.append(build(s, turns=2, n=10, task_key=f"k{s % 3}", group_index=s // 3))
    assert run.completed_pairs() == {(f"k{i}", g) for i in range(3) for g in range(2)}
    assert len(run.rows(task_key="k1")) == 2
    assert len(run.rows(task_key=["k1", "k2"], group_index=1)) == 2
    assert [r.reward for r in run.rows(order_by="-reward", limit=3)] == [1.0, 1.0, 1.0]
    with pytest.raises(ValueError):
        run.rows(bogus=1)
    df = run.index()
    assert list(df["task_key"]) == [f"k{s % 3}" for s in range(6)]
    assert run.index("polars").height == 6
    row = run.rows()[0]
    assert (row.turns, row.input_tokens, row.output_tokens, row.n_tokens) == (2, 20, 20, 40)
    assert (row.started, row.ended) == (1000.0, 1001.5)
    with pytest.raises(KeyError):
        run.get("nope")
    await run.close("interrupted")
    assert open_run(tmp_path / "r").meta["status"] == "interrupted"
    assert open_run(tmp_path / "r").meta["config"] == {"model": "m"}


async def test_second_writer_and_closed_run_are_refused(tmp_path: Path) -> None:
    run = await Run.create(tmp_path / "r")
    with pytest.raises(StoreError):
        await Run.create(tmp_path / "r", resume=True)
    await run.close()
    with pytest.raises(StoreError):
        await run.append(build(1, 1, 1))
    with pytest.raises(StoreError):
        await Run.create(tmp_path / "r")  # exists, no resume
    run = await Run.create(tmp_path / "r", resume=True)
    await run.append(build(2, 1, 1))
    await run.close()
    assert len(open_run(tmp_path / "r")) == 1


def test_open_missing_run_is_store_error(tmp_path: Path) -> None:
    with pytest.raises(StoreError):
        open_run(tmp_path / "nothing")


def test_row_from_live_episode_equals_row_from_its_header() -> None:
    from tracewire.store._rows import row_from_episode, row_from_header

    ep = build(3, turns=5, n=7)
    ep.add_error("x")
    ep.traces[0].add_error("y")
    ref = RecordRef(1, 2, 3, 4)
    assert row_from_episode(ep, ref, 5.0) == row_from_header(episode_parts(ep)[2], ref, 5.0)


@pytest.mark.parametrize("turns", [0, 3, 400])
def test_sliced_record_parts_equal_codec_frames_to_record(turns: int) -> None:
    from tracewire.codec import _binary, frames_to_record
    from tracewire.store import _encode

    ep = build(turns, turns=turns, n=3000)
    frames = encode_frames(ep)
    want = b"".join(bytes(memoryview(p)) for p in frames_to_record(frames))
    pauses = [0]
    old = _binary.CRC_SLICE
    _binary.CRC_SLICE = 4096  # many slices even for small buffers
    try:
        got = _encode.record_parts(frames, lambda: pauses.__setitem__(0, pauses[0] + 1))
    finally:
        _binary.CRC_SLICE = old
    assert b"".join(bytes(memoryview(p)) for p in got) == want
    assert (pauses[0] > 0) == (turns >= 3)


def test_write_parts_in_slices_writes_every_byte(tmp_path: Path) -> None:
    import os

    from tracewire.store._segments import write_parts

    parts = [b"a" * 10, bytes(range(256)) * 40, b"", memoryview(b"xyz" * 1000), b"q"]
    path = tmp_path / "f"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    pauses: list[int] = []
    try:
        n = write_parts(fd, parts, 0, lambda: pauses.append(1), max_write=777)
    finally:
        os.close(fd)
    want = b"".join(bytes(p) for p in parts)
    assert n == len(want) and path.read_bytes() == want
    # At most 777 bytes per writev (a pause after each one but the last).
    assert len(want) // 777 <= len(pauses) <= len(want) // 777 + len(parts)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="per-thread nice is Linux's")
async def test_writer_thread_runs_nicer_than_the_loop(tmp_path: Path) -> None:
    # The writer yields the CPU to the event loop's thread: its niceness is raised, the
    # loop thread's is not (field 19 of /proc/<pid>/task/<tid>/stat).
    import os
    import threading

    from tracewire.store._writer import WRITER_NICE

    def nice(tid: int) -> int:
        stat = Path(f"/proc/self/task/{tid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[16])

    run = await Run.create(tmp_path / "r")
    await run.append(build(1, turns=2, n=100))
    writers = [t for t in threading.enumerate() if t.name.startswith("tracewire-store:")]
    assert len(writers) == 1 and writers[0].native_id is not None
    base = nice(threading.get_native_id())
    assert nice(writers[0].native_id) == min(19, base + WRITER_NICE)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == base
    await run.close()
