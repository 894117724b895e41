"""``evaluate(..., backend="process")``: rollouts on env-server worker processes.

Real parts throughout: the built-in model as a child process, an env server with worker
processes, the ZMQ client, and the run store. The Ray backend runs the same checks inside
a private network namespace (``test_eval_ray.py``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tracewire.compose import BACKENDS, Summary, evaluate
from tracewire.compose._cli_eval import configure
from tracewire.store import open_run

CRASH_ENV = str(Path(__file__).with_name("crash_env.py"))


def _pairs(out: Path) -> dict[tuple[str, int], tuple[float, int, str | None, str | None]]:
    return {(e.task_key, e.group_index): (e.reward, len(e.traces[0].columns),
                                         e.traces[0].stop, e.group_id)
            for e in open_run(out).episodes()}


def test_the_command_line_offers_the_env_server_backends() -> None:
    import argparse

    assert BACKENDS == ("local", "process", "ray")
    parser = argparse.ArgumentParser()
    configure(parser)
    args = parser.parse_args(["arithmetic", "--backend", "ray", "--workers", "3",
                              "--ray-address", "auto", "--worker-cpus", "0.5",
                              "--worker-resources", '{"env_node": 1}'])
    assert (args.backend, args.workers, args.ray_address, args.worker_cpus) == \
        ("ray", 3, "auto", 0.5)


@pytest.mark.slow
async def test_process_backend_gives_the_rollouts_local_gives(tmp_path: Path) -> None:
    local = await evaluate("arithmetic", n=2, r=2, out=tmp_path / "local", seed=3)
    served = await evaluate("arithmetic", n=2, r=2, out=tmp_path / "proc", seed=3,
                            backend="process", workers=2, concurrency=3)
    assert served.status == local.status == "complete"
    a, b = _pairs(tmp_path / "local"), _pairs(tmp_path / "proc")
    assert sorted(a) == sorted(b) == [(f"arith-{i:04d}", j) for i in range(2) for j in range(2)]
    # Same seeds per (task, rollout): the same tokens, stop and reward on either backend.
    assert {k: v[:3] for k, v in a.items()} == {k: v[:3] for k, v in b.items()}
    sl, ss = local.summary, served.summary
    assert (ss.episodes, ss.tasks, ss.ok, ss.stops, ss.errors, ss.reward_mean) == \
        (sl.episodes, sl.tasks, sl.ok, sl.stops, sl.errors, sl.reward_mean)
    assert {f.name for f in dataclasses.fields(Summary)} <= set(vars(ss))
    config = open_run(tmp_path / "proc").meta["config"]
    assert config["upstream"].startswith("http://127.0.0.1:") and config["model"] == ss.model
    assert config["backend"] == "process"


@pytest.mark.slow
async def test_resume_works_across_backends(tmp_path: Path) -> None:
    out = tmp_path / "run"
    first = await evaluate("arithmetic", n=1, r=2, out=out)
    assert first.summary.episodes == 2
    second = await evaluate("arithmetic", n=2, r=2, out=out, resume=True, backend="process",
                            workers=1)
    assert (second.summary.episodes, second.summary.skipped) == (2, 2)
    pairs = _pairs(out)
    assert len(pairs) == 4 and len(list(open_run(out).episodes())) == 4
    # A resumed group keeps its id whichever backend ran which rollout.
    assert pairs[("arith-0000", 0)][3] == pairs[("arith-0000", 1)][3]
    assert pairs[("arith-0001", 0)][3] == pairs[("arith-0001", 1)][3]
    assert pairs[("arith-0000", 0)][3] != pairs[("arith-0001", 0)][3]
    third = await evaluate("arithmetic", n=2, r=2, out=out, resume=True)
    assert (third.summary.episodes, third.summary.skipped) == (0, 4)


@pytest.mark.slow
async def test_a_dead_worker_is_a_failed_rollout_that_resume_runs_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    marker = tmp_path / "crashed"
    monkeypatch.setenv("TW_CRASH_MARKER", str(marker))  # worker processes inherit it
    out = tmp_path / "run"
    res = await evaluate(CRASH_ENV, out=out, backend="process", workers=1, concurrency=1)
    assert marker.exists()  # the worker did die mid-episode
    assert res.status == "complete" and res.summary.episodes == 3
    assert res.summary.stops == {"serve_error": 1, "done": 2}
    assert res.summary.errors == {"serve:WorkerDiedError": 1}
    failed = [e for e in open_run(out).episodes() if not e.ok]
    assert [e.task_key for e in failed] == ["crash-000"] and failed[0].info["incomplete"]
    # What had arrived of it is in that failed episode: no journal is left to recover.
    assert not open_run(out).live() and not list((out / "live").iterdir())
    # Not retried by the eval (at most once); --resume runs just that rollout again.
    again = await evaluate(CRASH_ENV, out=out, backend="process", workers=1, resume=True)
    assert (again.summary.episodes, again.summary.skipped, again.summary.ok) == (1, 2, 1)
    assert again.summary.stops == {"done": 1}


def test_the_server_deadline_covers_every_phase_of_every_attempt() -> None:
    from tracewire.compose._backend_serve import _run_timeout
    from tracewire.env import Timeouts, load_environment

    env = load_environment("arithmetic")
    t = Timeouts(boot=1, setup=2, agent=3, finalize=4, scoring=5)
    assert _run_timeout(env, t) == 15 * (1 + env.retries) + 60
    assert _run_timeout(env, t.replace(agent=None)) >= 86400  # no deadline asked for


def test_workers_load_a_file_environment_by_its_absolute_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tracewire.compose._backend_serve import worker_ref

    monkeypatch.chdir(Path(CRASH_ENV).parent)
    assert worker_ref("crash_env.py") == CRASH_ENV
    assert worker_ref("crash_env.py:environment") == f"{CRASH_ENV}:environment"
    assert worker_ref("arithmetic") == "arithmetic"
    assert worker_ref("missing.py") == "missing.py"  # left for the loader to report


async def test_an_environment_loaded_first_keeps_its_file_reference_for_workers(
        tmp_path: Path) -> None:
    # `tracewire eval FILE.py --backend process` loads the environment before evaluating:
    # the workers must still be sent the file, not the environment's bare name.
    from tracewire.env import load_environment

    env = load_environment(str(Path(__file__).parents[2] / "examples" / "word_problems.py"))
    assert env.ref is not None and env.ref.endswith("word_problems.py")
    res = await evaluate(env, n=2, r=1, out=tmp_path / "run", backend="process", workers=1,
                         concurrency=2)
    episodes = list(open_run(tmp_path / "run").episodes())
    assert len(episodes) == 2 and all(e.ok for e in episodes), res.reason
