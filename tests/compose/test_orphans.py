"""A SIGKILLed ``tracewire eval`` leaves no model server behind: the built-in model it
started as a child asks the kernel to end it with its parent (``PR_SET_PDEATHSIG``).
Real processes throughout; Linux only (where the kernel offers that)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="PR_SET_PDEATHSIG is Linux's")


def _model_children(pid: int) -> list[psutil.Process]:
    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    return [k for k in kids if "model" in " ".join(k.cmdline())]


def test_a_killed_eval_takes_its_builtin_model_with_it(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tracewire", "eval", "arithmetic", "-n", "400", "-r", "8", "-q",
         "--out", str(tmp_path / "run")],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    models: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 60
        while not models and time.monotonic() < deadline:
            assert proc.poll() is None, "the eval ended before its model started"
            models = _model_children(proc.pid)
            time.sleep(0.1)
        assert models, "the eval never started its built-in model"
        # Kill mid-run, once the model has answered turns (a model killed before it printed
        # its URL would die of the closed pipe anyway, and prove nothing).
        segments = tmp_path / "run" / "segments"
        while not (segments.is_dir() and any(segments.iterdir())) \
                and time.monotonic() < deadline:
            assert proc.poll() is None, "the eval ended before the kill"
            time.sleep(0.1)
        time.sleep(0.5)
        assert proc.poll() is None, "the eval ended before the kill"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        _, alive = psutil.wait_procs(models, timeout=15)
        assert not alive, [p.cmdline() for p in alive]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for p in models:  # reparented by now: kill what the test saw
            if p.is_running():
                p.kill()
