"""``EvalPlan``: the one value an eval runs from. The keyword path (``evaluate``), the plan
path (``evaluate_plan``) and the command line (``tracewire eval``) build the same plan and
give the same run, each loads the environment once, and a bad option is a typed error
raised before anything is loaded or started.

Real parts throughout: the built-in model, the proxy, the run store, and a real
environment module (``counting_env``) that counts its own loads.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from pathlib import Path
from typing import Any

import pytest

import tracewire
from tracewire import PlanError, PlanTypeError, TracewireError
from tracewire.compose import (
    EvalOptions,
    EvalPlan,
    ModelOptions,
    OutputOptions,
    PlacementOptions,
    SamplingOptions,
    SandboxOptions,
    ScaleOptions,
    evaluate,
    evaluate_plan,
)
from tracewire.compose._cli_eval import configure, plan_from_args, run_cli
from tracewire.env import Timeouts
from tracewire.store import open_run

from . import counting_env

ENV = "tests.compose.counting_env"


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    configure(parser)
    return parser.parse_args(argv)


def _rollouts(out: Path) -> dict[tuple[str, int], Any]:
    """Per (task, rollout): reward, stop, and every node's token columns as bytes (a
    prompt's logprobs are NaN, which equals nothing as a float)."""
    found = {}
    for e in open_run(out).episodes():
        trace = e.traces[0]
        columns = [{k: v.tobytes() for k, v in trace.node_tokens(i).items()}
                   for i in range(len(trace.nodes))]
        found[(e.task_key, e.group_index)] = (e.reward, trace.stop, columns)
    return found


def test_every_option_of_evaluate_is_a_field_of_one_group() -> None:
    groups = [ModelOptions, SamplingOptions, ScaleOptions, SandboxOptions, PlacementOptions,
              OutputOptions]
    fields = [f.name for g in groups for f in dataclasses.fields(g)]
    assert len(fields) == len(set(fields)), "an option name in two groups"
    assert set(typing.get_type_hints(EvalOptions)) == set(fields)
    plan = EvalPlan("guess")
    assert set(plan.options()) == set(fields)
    assert EvalPlan.from_options("guess", **plan.options()) == plan


def test_from_options_puts_each_option_in_its_group() -> None:
    plan = EvalPlan.from_options(
        "guess", model="m", base_url="http://127.0.0.1:1/v1", seed=4, max_tokens=9, n=3,
        r=2, concurrency=5, runtime="bwrap", ro_paths=["/opt/a"], backend="process",
        workers=3, worker_resources={"gpu": 1}, out="runs/x", resume=True,
        timeouts=Timeouts(agent=5.0))
    assert plan == EvalPlan(
        "guess",
        model=ModelOptions(model="m", base_url="http://127.0.0.1:1/v1"),
        sampling=SamplingOptions(seed=4, max_tokens=9),
        scale=ScaleOptions(n=3, r=2, concurrency=5),
        sandbox=SandboxOptions(runtime="bwrap", ro_paths=("/opt/a",),
                               timeouts=Timeouts(agent=5.0)),
        placement=PlacementOptions(backend="process", workers=3,
                                   worker_resources={"gpu": 1.0}),
        output=OutputOptions(out=Path("runs/x"), resume=True),
    )
    # Normalised as it is checked: a list of paths is a tuple, out a Path, numbers floats.
    assert plan.sandbox.ro_paths == ("/opt/a",) and isinstance(plan.output.out, Path)
    assert plan.placement.worker_resources == {"gpu": 1.0}
    assert plan.sampling.overrides() == {"max_tokens": 9}


def test_the_command_line_builds_the_plan_the_options_describe() -> None:
    args = _parse([ENV, "-n", "2", "-r", "3", "-c", "4", "--seed", "7", "--max-tokens", "5",
                   "--temperature", "0.5", "--backend", "process", "--workers", "2",
                   "--worker-resources", '{"env_node": 1}', "--out", "runs/y",
                   "--upstream-api", "generate", "--tokenizer", "tok"])
    assert plan_from_args(args) == EvalPlan.from_options(
        ENV, n=2, r=3, concurrency=4, seed=7, max_tokens=5, temperature=0.5,
        backend="process", workers=2, worker_resources={"env_node": 1.0}, out="runs/y",
        upstream_api="generate", tokenizer="tok")
    with pytest.raises(PlanError, match="--worker-resources"):
        plan_from_args(_parse([ENV, "--worker-resources", "[1]"]))


async def test_plan_and_keywords_give_the_same_run_loading_the_env_once(
        tmp_path: Path) -> None:
    before = counting_env.LOADS
    by_keywords = await evaluate(ENV, n=2, r=2, seed=3, max_tokens=4, concurrency=2,
                                 out=tmp_path / "kw" / "run")
    assert before + 1 == counting_env.LOADS
    plan = EvalPlan(ENV, sampling=SamplingOptions(seed=3, max_tokens=4),
                    scale=ScaleOptions(n=2, r=2, concurrency=2),
                    # The same run name: it keys the groups, and so each rollout's seed.
                    output=OutputOptions(out=tmp_path / "plan" / "run"))
    by_plan = await evaluate_plan(plan)
    assert before + 2 == counting_env.LOADS
    assert by_keywords.status == by_plan.status == "complete"
    a, b = _rollouts(tmp_path / "kw" / "run"), _rollouts(tmp_path / "plan" / "run")
    assert sorted(a) == [(f"count-{i}", j) for i in (1, 2) for j in (0, 1)]
    assert a == b
    assert all(columns for _r, _s, columns in a.values())
    ka, kb = by_keywords.summary, by_plan.summary
    assert (ka.episodes, ka.tasks, ka.ok, ka.stops, ka.errors, ka.reward_mean) == \
        (kb.episodes, kb.tasks, kb.ok, kb.stops, kb.errors, kb.reward_mean)
    meta_a, meta_b = (open_run(tmp_path / d / "run").meta["config"] for d in ("kw", "plan"))
    assert {k: v for k, v in meta_a.items() if k != "upstream"} == \
        {k: v for k, v in meta_b.items() if k != "upstream"}
    assert meta_a["sampling"] == {"max_tokens": 4} and meta_a["seed"] == 3


async def test_the_command_line_loads_the_env_once(tmp_path: Path) -> None:
    before = counting_env.LOADS
    code, run_dir = await run_cli(_parse([ENV, "-n", "1", "-q", "--out", str(tmp_path / "c")]))
    assert (code, run_dir) == (0, str(tmp_path / "c"))
    assert before + 1 == counting_env.LOADS
    assert len(_rollouts(tmp_path / "c")) == 1


BAD: list[tuple[dict[str, Any], type[TracewireError], str]] = [
    ({"r": 0}, PlanError, "r must be >= 1, not 0"),
    ({"n": -1}, PlanError, "n must be >= 0"),
    ({"concurrency": 0}, PlanError, "concurrency must be >= 1"),
    ({"workers": 0}, PlanError, "workers must be >= 1"),
    ({"r": "2"}, PlanTypeError, "r must be an int, not str"),
    ({"n": True}, PlanTypeError, "n must be an int or None, not bool"),
    ({"max_model_len": 0}, PlanError, "max_model_len must be >= 1"),
    ({"temperature": -0.5}, PlanError, "temperature must be >= 0"),
    ({"temperature": "hot"}, PlanTypeError, "temperature must be a number or None"),
    ({"backend": "nowhere"}, PlanError, "unknown backend 'nowhere' \\(known: local, "),
    ({"upstream_api": "grpc"}, PlanError, "unknown upstream_api 'grpc'"),
    ({"engine": "vllm"}, PlanError, "unknown engine 'vllm'"),
    ({"engine": "llamacpp", "base_url": "http://127.0.0.1:1"}, PlanError,
     "engine serves its own model"),
    ({"runtime": "vm"}, PlanError, "unknown runtime 'vm'"),
    ({"runtime": 3}, PlanTypeError, "runtime must be a runtime name or a factory"),
    ({"ro_paths": "/opt"}, PlanTypeError, "ro_paths must be a list of paths, not str"),
    ({"sandbox_paths": [1]}, PlanTypeError, "sandbox_paths holds a int"),
    ({"timeouts": {"agent": 1}}, PlanTypeError, "timeouts must be a Timeouts"),
    ({"worker_cpus": 0}, PlanError, "worker_cpus must be > 0"),
    ({"worker_resources": {"gpu": "one"}}, PlanTypeError, "worker_resources\\['gpu'\\]"),
    ({"resume": True}, PlanError, "--resume needs --out"),
    ({"resume": "yes", "out": "x"}, PlanTypeError, "resume must be a bool"),
    ({"out": 5}, PlanTypeError, "out must be a path"),
    ({"rollouts": 2}, PlanTypeError, "unknown eval option 'rollouts'"),
]


@pytest.mark.parametrize(("options", "error", "match"), BAD,
                         ids=[next(iter(o)) + "-" + e.__name__ for o, e, _m in BAD])
async def test_a_bad_option_is_a_typed_error_before_the_env_loads(
        options: dict[str, Any], error: type[TracewireError], match: str) -> None:
    before = counting_env.LOADS
    with pytest.raises(error, match=match) as caught:
        await evaluate(ENV, **options)
    assert before == counting_env.LOADS
    # Each also is the built-in error it stands in for, so ``except ValueError`` holds.
    assert isinstance(caught.value, ValueError)
    if error is PlanTypeError:
        assert isinstance(caught.value, TypeError)


def test_a_plan_is_checked_when_made() -> None:
    with pytest.raises(PlanTypeError, match=r"EvalPlan\.scale must be a ScaleOptions"):
        EvalPlan("guess", scale={"n": 1})  # type: ignore[arg-type]
    with pytest.raises(PlanError, match="env must name an environment"):
        EvalPlan(" ")
    with pytest.raises(PlanTypeError, match="env must be an environment reference"):
        EvalPlan(42)  # type: ignore[arg-type]
    plan = EvalPlan("guess")
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.env = "tools"  # type: ignore[misc]
    # dataclasses.replace checks the new group too.
    with pytest.raises(PlanError):
        dataclasses.replace(plan, scale=dataclasses.replace(plan.scale, r=0))
    assert tracewire.PlanError is PlanError


async def test_the_command_line_reports_a_bad_option_in_one_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    before = counting_env.LOADS
    code, run_dir = await run_cli(_parse([ENV, "-r", "0", "-q"]))
    assert (code, run_dir) == (1, None)
    assert capsys.readouterr().err.strip() == "tracewire eval: r must be >= 1, not 0"
    assert before == counting_env.LOADS
