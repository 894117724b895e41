"""``tracewire train`` from the command line: per-step lines, a summary and a stored run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tracewire.cli import main
from tracewire.store import open_run


def test_train_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    rc = main(["train", "arithmetic", "--steps", "2", "--group-size", "2", "--tasks-per-step",
               "2", "-n", "4", "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0
    assert text.count("step ") >= 2 and "mismatch max 0 " in text
    assert f"run: {out}" in text
    steps = [json.loads(line) for line in (out / "train_steps.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [0, 1]
    assert len(list(open_run(out))) == 8


def test_train_command_rejects_bad_options(capsys: pytest.CaptureFixture[str],
                                           tmp_path: Path) -> None:
    rc = main(["train", "arithmetic", "--steps", "0", "--out", str(tmp_path / "r")])
    assert rc == 1
    assert "need steps" in capsys.readouterr().err
