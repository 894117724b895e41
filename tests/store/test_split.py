"""``Run`` hands out a ``RunWriter`` (create) or a ``RunReader`` (open); the reader has no
write API, the writer has the read API too, and the old entry points still work."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import tracewire
from tracewire.store import Run, RunReader, RunWriter, open_run

from .helpers import build, check


def test_create_gives_a_writer_and_open_a_reader(tmp_path: Path) -> None:
    async def go() -> None:
        run = await Run.create(tmp_path / "r", fsync="never")
        assert type(run) is RunWriter and run.writable
        assert isinstance(run, Run) and isinstance(run, RunReader)
        ep = build(1, 2, 50)
        ref = await run.append(ep)
        # The writer reads what it wrote, through the reader's API.
        assert [r.episode_id for r in run.rows()] == [ep.id] and len(run) == 1
        check(run.read(ref))
        assert run.completed_pairs() == {(ep.task_key, ep.group_index)}
        await run.close()
        assert not run.writable
        with pytest.raises(tracewire.StoreError, match="not open for writing"):
            await run.append(ep)

        for reader in (Run.open(tmp_path / "r"), open_run(tmp_path / "r"),
                       RunReader.open(tmp_path / "r"), tracewire.open_run(tmp_path / "r")):
            assert type(reader) is RunReader and isinstance(reader, Run)
            assert not reader.writable and reader.meta["status"] == "complete"
            assert not hasattr(reader, "append") and not hasattr(reader, "journal")
            check(reader.get(ep.id))
            await reader.close()

    asyncio.run(go())


def test_run_itself_is_not_a_run(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"Run\.create"):
        Run()
    assert tracewire.Run is Run


def test_async_with_closes_a_writer_as_interrupted_on_error(tmp_path: Path) -> None:
    async def go() -> None:
        with pytest.raises(RuntimeError):
            async with await RunWriter.create(tmp_path / "r", fsync="never") as run:
                await run.append(build(2, 1, 10))
                raise RuntimeError("stop")
        assert not run.writable and run.meta["status"] == "interrupted"
        with Run.open(tmp_path / "r") as reader:
            assert len(reader) == 1 and reader.meta["status"] == "interrupted"
        # The lock was released: the run can be resumed.
        again = await Run.create(tmp_path / "r", resume=True, fsync="never")
        assert len(again) == 1
        await again.close()

    asyncio.run(go())


def test_index_statements_are_written_in_schema_only() -> None:
    # Every module of the store builds its upserts and table definitions with _schema's
    # functions; a second hand-written copy would drift from the columns IndexRow declares.
    store = Path(tracewire.__file__).parent / "store"
    spelled = {p.name for p in store.glob("*.py")
               if any(w in p.read_text() for w in ("INSERT ", "CREATE TABLE", "ALTER TABLE"))}
    assert spelled == {"_schema.py"}, spelled
