"""``tracewire demo`` ends with the commands to view and export its run, in a form the
user's shell can run: ``tracewire`` when that is on PATH (an activated venv), else the
script's path (``.venv/bin/tracewire`` from the project root: see test_docs_commands)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from . import doccmds

VENV_BIN = Path(sys.prefix) / "bin"


def demo(tmp_path: Path, activated: bool) -> list[str]:
    env = doccmds.user_env(doccmds.ROOT)
    if activated:
        env["PATH"] = f"{VENV_BIN}{os.pathsep}{env['PATH']}"
        env["VIRTUAL_ENV"] = sys.prefix
    res = subprocess.run([sys.executable, "-m", "tracewire", "demo", "-n", "2", "-r", "1",
                          "--out", "runs/d"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stderr[-2000:]
    hints = doccmds.HINT.findall(res.stdout)
    assert len(hints) == 2, res.stdout
    return hints


@pytest.mark.parametrize("activated", [True, False])
def test_demo_hints_run_as_printed(tmp_path: Path, activated: bool) -> None:
    view, export = demo(tmp_path, activated)
    prog = "tracewire" if activated else str(VENV_BIN / "tracewire")
    assert view == f"{prog} view runs/d"
    assert export == f"{prog} export runs/d --format jsonl"
    env = doccmds.user_env(doccmds.ROOT)
    if activated:
        env["PATH"] = f"{VENV_BIN}{os.pathsep}{env['PATH']}"
    res = subprocess.run(["bash", "-c", export], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "runs" / "d.jsonl").is_file()
