"""Live view of in-flight episodes: pending messages journaled, incremental journal reads."""

from __future__ import annotations

import os
from pathlib import Path

from tracewire import Episode, Message
from tracewire.codec import RECORD_PREFIX, record_length
from tracewire.store import Run, open_run
from tracewire.store._journal import JournalTail

from .helpers import add_turn, check


def _episode(seed: int, n: int) -> Episode:
    ep = Episode(env="test", task_key=f"k{seed}", task={"seed": seed})
    ep.info.update(seed=seed, n=n)
    ep.new_trace()
    return ep


async def test_pending_reaches_other_readers_but_never_the_record(tmp_path: Path) -> None:
    run = await Run.create(tmp_path / "r", fsync="always")
    ep = _episode(3, 20)
    run.journal(ep)
    add_turn(ep, 3, 0, 20)
    ep.traces[0].notify()
    marker = "tool result PENDING-7f3a"
    ep.traces[0].set_pending([Message(role="tool", content=marker, tool_call_id="c1")])
    await run.flush()
    with open_run(tmp_path / "r") as reader:  # as a `tracewire view` process does
        (live,) = reader.live()
        assert [m.content for m in live.traces[0].pending] == [marker]
        check(live, complete=False)
        ep.traces[0].set_pending([])  # committed: the preview goes away
        add_turn(ep, 3, 1, 20)
        ep.traces[0].notify()
        await run.flush()
        (live,) = reader.live()
        assert live.traces[0].pending == [] and len(live.traces[0].calls) == 2
        ep.traces[0].set_pending([Message(role="user", content=marker)])
        await run.flush()
        assert [m.content for m in reader.live()[0].traces[0].pending] == [marker]
        await run.append(ep)  # appended while a request was still pending
        assert reader.live() == []
        stored = reader.get(ep.id)
        assert stored.traces[0].pending == []
        check(stored, complete=False)
    await run.close()
    for seg in (tmp_path / "r" / "segments").iterdir():
        assert marker.encode() not in seg.read_bytes()
    assert marker.encode() not in (tmp_path / "r" / "index.sqlite").read_bytes()


async def test_live_reads_only_new_journal_bytes(tmp_path: Path) -> None:
    run = await Run.create(tmp_path / "r", fsync="always")
    a, b = _episode(1, 30), _episode(2, 30)
    run.journal(a)
    run.journal(b)
    for k in range(2):
        add_turn(a, 1, k, 30)
        a.traces[0].notify()
    await run.flush()
    reader = open_run(tmp_path / "r")
    first = {e.id: e for e in reader.live()}
    assert set(first) == {a.id, b.id} and len(first[a.id].traces[0].calls) == 2
    # Damage bytes already read: an incremental reader never looks at them again (a full
    # re-read would stop at the damaged first record and show an empty episode).
    path = tmp_path / "r" / "live" / f"{a.id}.twj"
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, b"\xff" * 16, RECORD_PREFIX + 8)
    finally:
        os.close(fd)
    for k in range(2, 5):
        add_turn(a, 1, k, 30)
        a.traces[0].notify()
    await run.flush()
    again = {e.id: e for e in reader.live()}
    assert again[a.id] is first[a.id]  # the same episode, grown in place
    assert len(again[a.id].traces[0].calls) == 5
    check(again[a.id], complete=False)
    # Finished episodes are dropped (and forgotten); the other one stays.
    await run.append(a)
    assert [e.id for e in reader.live()] == [b.id]
    assert [p.name for p in reader._live.tails] == [f"{b.id}.twj"]
    await run.append(b)
    assert reader.live() == [] and reader._live.tails == {}
    reader._release()
    await run.close()


async def test_journal_tail_waits_for_a_record_being_written(tmp_path: Path) -> None:
    run = await Run.create(tmp_path / "r", fsync="always")
    ep = _episode(4, 10)
    run.journal(ep)
    for k in range(3):
        add_turn(ep, 4, k, 10)
        ep.traces[0].notify()
    await run.flush()
    data = (tmp_path / "r" / "live" / f"{ep.id}.twj").read_bytes()
    await run.close()
    sizes, pos = [], 0
    while pos < len(data):
        sizes.append(record_length(data[pos : pos + RECORD_PREFIX]))
        pos += sizes[-1]
    assert len(sizes) == 4  # the empty start, then one per turn
    copy = tmp_path / "copy.twj"
    cut = sum(sizes[:3]) + sizes[3] // 2
    copy.write_bytes(data[:cut])  # the last record is half written
    tail = JournalTail(copy)
    assert tail.poll() and tail.episode is not None
    assert len(tail.episode.traces[0].calls) == 2 and tail.offset == sum(sizes[:3])
    copy.write_bytes(data)  # the rest arrives (same file, now whole)
    assert tail.poll() and len(tail.episode.traces[0].calls) == 3 and not tail.stuck
    copy.unlink()
    assert not tail.poll()
