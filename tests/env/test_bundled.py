"""Each bundled environment end to end: built-in model → proxy → harness → store → read."""

from __future__ import annotations

from pathlib import Path

import pytest

from tracewire.compose import evaluate
from tracewire.env import load_environment
from tracewire.model import ChatTemplate, ServerThread
from tracewire.store import open_run

from .conftest import check_token_exact

PHASES = ("boot", "setup", "agent", "finalize", "scoring")


@pytest.mark.parametrize(
    ("name", "n", "r", "reward"),
    [("arithmetic", 4, 2, "correct"), ("tools", 3, 2, "correct"), ("guess", 3, 2, "solved"),
     ("command", 2, 1, "correct")],
)
async def test_bundled_env_end_to_end(
    name: str, n: int, r: int, reward: str, tmp_path: Path, model: ServerThread,
    template: ChatTemplate,
) -> None:
    env = load_environment(name)
    out = tmp_path / "run"
    result = await evaluate(name, base_url=model.base_url, n=n, r=r, out=out, concurrency=4)
    assert result.status == "complete" and result.reason is None
    assert result.summary.episodes == n * r
    run = open_run(out)
    assert run.meta["status"] == "complete"
    episodes = list(run.episodes())
    assert len(episodes) == n * r
    assert run.completed_pairs() == {(e.task_key, e.group_index) for e in episodes}
    keys = [t.key for t in env.take(n)]
    assert sorted({e.task_key for e in episodes}) == sorted(keys)
    groups: dict[str, set[str | None]] = {}
    for ep in episodes:
        groups.setdefault(ep.task_key, set()).add(ep.group_id)
        assert ep.env == name and ep.ok
        (trace,) = ep.traces
        assert trace.completed and trace.ok and not trace.errors
        for phase in PHASES:
            span = trace.timing[phase]
            assert span.end is not None and span.end >= span.start
        assert reward in trace.rewards
        assert trace.rewards[reward].score in (0.0, 1.0)
        assert trace.calls, "the harness reached the model through the proxy"
        tools = env.harness.schemas if name == "tools" else None  # type: ignore[attr-defined]
        assert check_token_exact(trace, template, tools) == len(trace.calls)
        if name == "command":
            info = trace.info["command"]
            assert info["exit_code"] == 0 and info["argv"][-1].endswith("command_agent.py")
            assert info["stdout"].strip() == trace.info["reply"]
    # R rollouts of a task share one group id; different tasks do not.
    assert all(len(ids) == 1 for ids in groups.values())
    assert len({next(iter(ids)) for ids in groups.values()}) == n


async def test_guess_is_multi_turn_with_feedback(tmp_path: Path, model: ServerThread) -> None:
    await evaluate("guess", base_url=model.base_url, n=3, r=2, out=tmp_path / "g")
    feedback = {"Higher.", "Lower.", "Please reply with a number."}
    multi = 0
    for ep in open_run(tmp_path / "g").episodes():
        trace = ep.traces[0]
        assert trace.stop in ("solved", "out_of_guesses")
        users = [n.message.content for n in trace.nodes if n.message.role == "user"]
        assert users[0] == ep.task["first_message"]
        assert set(users[1:]) <= feedback
        guesses = sum(1 for n in trace.nodes if n.sampled)
        assert guesses <= ep.task["max_turns"]
        assert trace.metrics["guesses"] == guesses
        multi += guesses > 1
    assert multi, "at least one game took several turns"
