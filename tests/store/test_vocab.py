"""The store's closed vocabularies are StrEnums with the strings runs have always held."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from tracewire.store import EpisodeStatus, FsyncPolicy, Run, RunStatus, open_run

from .helpers import build


def test_values_are_the_recorded_strings() -> None:
    assert [p.value for p in FsyncPolicy] == ["always", "interval", "never"]
    assert [s.value for s in RunStatus] == ["running", "complete", "interrupted"]
    assert [s.value for s in EpisodeStatus] == ["complete", "incomplete"]
    assert FsyncPolicy.NEVER == "never"  # a StrEnum compares equal to its string


async def test_run_takes_enum_or_string_and_writes_plain_strings(tmp_path: Path) -> None:
    async with await Run.create(tmp_path / "a", fsync=FsyncPolicy.NEVER) as run:
        await run.append(build(1, 1, 4))
    run2 = await Run.create(tmp_path / "b", fsync="always")
    await run2.close(RunStatus.INTERRUPTED)
    meta_a = orjson.loads((tmp_path / "a" / "meta.json").read_bytes())
    meta_b = orjson.loads((tmp_path / "b" / "meta.json").read_bytes())
    assert meta_a["store"]["fsync"] == "never" and meta_a["status"] == "complete"
    assert meta_b["store"]["fsync"] == "always" and meta_b["status"] == "interrupted"
    with open_run(tmp_path / "a") as r:
        assert RunStatus(r.meta["status"]) is RunStatus.COMPLETE
        assert EpisodeStatus(r.rows()[0].status) is EpisodeStatus.COMPLETE
    with pytest.raises(ValueError, match="fsync must be one of always, interval, never"):
        await Run.create(tmp_path / "c", fsync="sometimes")
