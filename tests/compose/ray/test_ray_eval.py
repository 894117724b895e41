"""``tracewire eval --backend ray``: the bundled environments' rollouts on Ray actors.

Inside the namespace only (see ``tests/compose/test_eval_ray.py``). Real parts: a local
Ray instance with actors running the env-server workers, the built-in model on loopback
(reachable from the actors, which run on this node), the run store.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tracewire.compose import evaluate
from tracewire.store import open_run

BUNDLED = ("arithmetic", "tools", "guess", "command")


def _pairs(out: Path) -> dict[tuple[str, int], tuple[float, int, str | None]]:
    return {(e.task_key, e.group_index): (e.reward, len(e.traces[0].columns), e.traces[0].stop)
            for e in open_run(out).episodes()}


@pytest.mark.parametrize("env", BUNDLED)
async def test_bundled_env_on_ray_matches_local(env: str, ray_instance: Any,
                                                tmp_path: Path) -> None:
    local = await evaluate(env, n=2, r=2, out=tmp_path / "local", concurrency=4)
    served = await evaluate(env, n=2, r=2, out=tmp_path / "ray", concurrency=4,
                            backend="ray", workers=2)
    sl, ss = local.summary, served.summary
    assert served.status == "complete" and served.reason is None
    assert ss.episodes == 4 and not any(k.startswith("serve:") for k in ss.errors), ss.errors
    assert "serve_error" not in ss.stops
    # The same summary, field by field, except what is timing.
    same = ("episodes", "tasks", "ok", "stops", "errors", "reward_mean", "rewards", "pass_at",
            "turns_mean", "tokens_mean", "completion_tokens_mean", "skipped")
    assert {f: getattr(ss, f) for f in same} == {f: getattr(sl, f) for f in same}
    assert _pairs(tmp_path / "ray") == _pairs(tmp_path / "local")
    assert open_run(tmp_path / "ray").meta["config"]["backend"] == "ray"


async def test_resume_across_local_ray_and_process(ray_instance: Any, tmp_path: Path) -> None:
    out = tmp_path / "run"
    await evaluate("arithmetic", n=1, r=2, out=out)
    on_ray = await evaluate("arithmetic", n=2, r=2, out=out, resume=True, backend="ray",
                            workers=1)
    assert (on_ray.summary.episodes, on_ray.summary.skipped) == (2, 2)
    groups = {(e.task_key, e.group_index): e.group_id for e in open_run(out).episodes()}
    assert len(groups) == 4 and groups[("arith-0001", 0)] == groups[("arith-0001", 1)]
    assert groups[("arith-0000", 0)] == groups[("arith-0000", 1)]
    more = await evaluate("arithmetic", n=3, r=2, out=out, resume=True, backend="process",
                          workers=1)
    assert (more.summary.episodes, more.summary.skipped) == (2, 4)
    again = await evaluate("arithmetic", n=3, r=2, out=out, resume=True, backend="ray",
                           workers=1)
    assert (again.summary.episodes, again.summary.skipped) == (0, 6)


def test_cli_eval_backend_ray_and_resume(tmp_path: Path) -> None:
    # A process of its own: it joins (or starts) Ray on its main thread before its loop.
    out = tmp_path / "cli"
    base = [sys.executable, "-m", "tracewire", "eval", "guess", "-n", "2", "-r", "2", "-q",
            "--out", str(out), "--backend", "ray", "--workers", "2", "--worker-cpus", "0.5"]
    first = subprocess.run(base, capture_output=True, text=True, timeout=180)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "complete" in first.stdout and "episodes      4 over 2 tasks" in first.stdout
    again = subprocess.run([*base[:-6], "--backend", "local", "--resume", "-n", "3"],
                           capture_output=True, text=True, timeout=180)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "episodes      2 over 1 tasks" in again.stdout, again.stdout
    assert len(list(open_run(out).episodes())) == 6
