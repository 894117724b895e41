"""``tracewire export``: the file lands beside the run (not in the cwd) unless ``--out``
names one, and the path it wrote is printed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pandas as pd
import pytest

from tracewire.cli import main as cli_main
from tracewire.codec import decode_json
from tracewire.store import Run

from .helpers import build


def make_run(path: Path, n: int = 3) -> list[str]:
    async def go() -> list[str]:
        eps = [build(s, turns=1, n=10, task_key=f"k{s}") for s in range(n)]
        async with await Run.create(path) as run:
            for e in eps:
                await run.append(e)
        return [e.id for e in eps]
    return asyncio.run(go())


@pytest.mark.parametrize(("fmt", "ext"), [("jsonl", ".jsonl"), ("parquet", ".parquet")])
def test_default_is_beside_the_run_and_printed(tmp_path: Path, fmt: str, ext: str,
                                               monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    ids = make_run(tmp_path / "runs" / "r1")
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert cli_main(["export", str(tmp_path / "runs" / "r1"), "--format", fmt]) == 0
    out = tmp_path / "runs" / f"r1{ext}"
    assert out.is_file()
    assert list(elsewhere.iterdir()) == []          # nothing written into the cwd
    assert str(out) in capsys.readouterr().err      # the user is told where it went
    if fmt == "jsonl":
        assert [decode_json(x).id for x in out.read_bytes().splitlines()] == ids
    else:
        assert list(pd.read_parquet(out)["episode_id"]) == ids


def test_relative_run_path_resolves_beside_it(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    make_run(tmp_path / "runs" / "r2", n=1)
    monkeypatch.chdir(tmp_path)
    assert cli_main(["export", "runs/r2"]) == 0
    assert (tmp_path / "runs" / "r2.jsonl").is_file()


def test_out_path_is_used_as_given(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ids = make_run(tmp_path / "r3", n=2)
    dest = tmp_path / "elsewhere" / "mine.jsonl"
    dest.parent.mkdir()
    assert cli_main(["export", str(tmp_path / "r3"), "--out", str(dest)]) == 0
    assert [decode_json(x).id for x in dest.read_bytes().splitlines()] == ids
    assert not (tmp_path / "r3.jsonl").exists()
    assert str(dest) in capsys.readouterr().err


def test_out_into_missing_directory_fails_cleanly(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    make_run(tmp_path / "r4", n=1)
    assert cli_main(["export", str(tmp_path / "r4"), "--out",
                     str(tmp_path / "no" / "such" / "x.jsonl")]) == 1
    assert "tracewire export:" in capsys.readouterr().err
