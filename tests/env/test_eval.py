"""``tracewire eval`` / ``evaluate``: resume, Ctrl-C, failures that stop an eval, loading."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import tracewire
from tracewire import EnvError, StoreError
from tracewire.compose import evaluate
from tracewire.env import Environment, load_environment
from tracewire.model import ServerThread
from tracewire.store import open_run

HERE = Path(__file__).parent
SLOW_ENV = str(HERE / "slow_env.py")


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "tracewire", "eval", *args]


async def test_resume_skips_finished_pairs(tmp_path: Path, model: ServerThread) -> None:
    out = tmp_path / "run"
    await evaluate("arithmetic", base_url=model.base_url, n=2, r=2, out=out)
    first = {e.id: (e.task_key, e.group_index, e.group_id) for e in open_run(out).episodes()}
    assert len(first) == 4
    with pytest.raises(EnvError, match="already holds a run"):
        await evaluate("arithmetic", base_url=model.base_url, n=2, out=out)
    result = await evaluate("arithmetic", base_url=model.base_url, n=3, r=3, out=out,
                            resume=True)
    assert result.summary.episodes == 5 and result.summary.skipped == 4
    busy = result.summary.loop_busy
    assert busy is not None and 0.0 < busy <= 1.0
    assert result.summary.as_dict()["loop_busy"] == busy
    run = open_run(out)
    episodes = list(run.episodes())
    assert len(episodes) == 9
    pairs = [(e.task_key, e.group_index) for e in episodes]
    assert len(set(pairs)) == 9
    for e in episodes:  # old episodes kept; resumed groups keep their group id
        if e.id in first:
            assert first[e.id] == (e.task_key, e.group_index, e.group_id)
    gids: dict[str, set[str | None]] = {}
    for e in episodes:
        gids.setdefault(e.task_key, set()).add(e.group_id)
    assert all(len(g) == 1 for g in gids.values())


async def test_python_api(tmp_path: Path, model: ServerThread) -> None:
    result = await tracewire.evaluate("guess", base_url=model.base_url, n=2, r=1,
                                      out=tmp_path / "r", max_tokens=4, api_key="k")
    assert result.status == "complete" and result.reason is None
    assert len(list(result.run.episodes())) == 2 and result.summary.episodes == 2
    assert result.run.meta["config"]["sampling"]["max_tokens"] == 4
    assert tracewire.Environment is Environment


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["no_such_env_xyz"], "unknown environment 'no_such_env_xyz'"),
        (["guess", "--base-url", "http://127.0.0.1:9/v1"], "cannot reach the model server"),
        (["guess", "--resume"], "--resume needs --out"),
    ],
)
def test_cli_fails_with_one_line(args: list[str], needle: str, tmp_path: Path) -> None:
    p = subprocess.run(cli(*args, "--out" if "--resume" not in args else "-q",
                           str(tmp_path / "x") if "--resume" not in args else "-q"),
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert p.returncode == 1
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], p.stderr
    assert not (tmp_path / "x" / "segments").exists()


def test_ctrl_c_keeps_finished_episodes(tmp_path: Path, model: ServerThread) -> None:
    out = tmp_path / "int"
    proc = subprocess.Popen(cli(SLOW_ENV, "--base-url", model.base_url, "-n", "100", "-c", "3",
                                "--out", str(out), "-q"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(600):
            try:
                if len(open_run(out)) >= 2:
                    break
            except StoreError:
                pass  # not created yet
            if proc.poll() is not None:
                pytest.fail(f"eval ended early: {proc.communicate()}")
            __import__("time").sleep(0.05)
        else:
            pytest.fail("no episode finished")
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, stderr
    assert "interrupted" in stdout and "--resume" in stdout
    assert "reward" in stdout and f"run directory: {out}" in stdout
    run = open_run(out)
    assert run.meta["status"] == "interrupted"
    statuses = {r.episode_id: r.status for r in run.rows()}
    finished = [e for e in run.episodes() if statuses[e.id] == "complete"]
    assert 2 <= len(finished) < 100
    assert all(e.traces[0].completed and e.traces[0].rewards for e in finished)
    # Rollouts cut short (kept by the store as partial records) are not counted as done.
    assert run.completed_pairs() == {(e.task_key, e.group_index) for e in finished}


async def test_stop_event_interrupts(tmp_path: Path, model: ServerThread) -> None:
    stop = asyncio.Event()
    seen = 0

    def on_episode(_e: object, _t: object) -> None:
        nonlocal seen
        seen += 1
        if seen == 2:
            stop.set()

    result = await evaluate(SLOW_ENV, base_url=model.base_url, n=50, concurrency=2,
                            out=tmp_path / "s", stop=stop, on_episode=on_episode)
    assert result.status == "interrupted"
    assert open_run(tmp_path / "s").meta["status"] == "interrupted"
    assert 2 <= result.summary.episodes < 50


def test_load_environment_forms(tmp_path: Path) -> None:
    assert load_environment("guess").name == "guess"
    assert load_environment(SLOW_ENV).name == "slow"
    assert load_environment(f"{SLOW_ENV}:environment").name == "slow"
    mod = tmp_path / "pkg_env_mod.py"
    mod.write_text("from tracewire.env.bundled.arithmetic import load_environment\n")
    sys.path.insert(0, str(tmp_path))
    try:
        assert load_environment("pkg_env_mod").name == "arithmetic"
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("pkg_env_mod", None)
    with pytest.raises(EnvError, match="unknown environment"):
        load_environment("nope_nope")
    with pytest.raises(EnvError, match="no attribute"):
        load_environment("tracewire.env.bundled.guess:missing")
    env = load_environment("guess")
    with pytest.raises(EnvError, match="defines no environment"):
        load_environment("tracewire.env.bundled._common")
    assert load_environment(env) is env
