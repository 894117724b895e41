"""Rollout lifecycle: phases timed, timeouts and errors in every phase, retries, and a
failing or hanging agent subprocess — always recorded on the trace, never raised."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from tracewire.env import (
    ChatHarness,
    CommandHarness,
    Environment,
    Rollout,
    Task,
    Timeouts,
    final_text,
    run_rollout,
)
from tracewire.model import MODEL_NAME, ChatTemplate
from tracewire.proxy import Proxy
from tracewire.trace import Episode, Trace

from .conftest import check_token_exact

TASK = Task("t0", {"system": "Answer with one word.", "prompt": "What is the capital of France?",
                   "answer": "Paris"})
# Deadlines no healthy phase meets late, even on a loaded CI machine; a test that wants a
# phase to time out shortens that phase's deadline alone (SHORT), so no other phase can
# time out instead (a 0.3 s agent deadline once lost a finalize test to agent_timeout).
GENEROUS = Timeouts(boot=10, setup=10, agent=10, finalize=10, scoring=10)
SHORT = 0.3


def is_paris(task: Task, trace: Trace) -> float:
    return 1.0 if final_text(trace).strip().rstrip(".") == task["answer"] else 0.0


async def hang(*_: Any) -> None:
    await asyncio.sleep(30)


def boom(*_: Any) -> None:
    raise RuntimeError("boom")


class BootFails(ChatHarness):
    async def boot(self, rollout: Rollout) -> None:
        raise OSError("no sandbox")


def make_env(**kw: Any) -> Environment:
    harness = kw.pop("harness", None) or ChatHarness(max_turns=2)
    kw.setdefault("timeouts", GENEROUS)
    return Environment("t", tasks=[TASK], harness=harness, rewards=[is_paris],
                       sampling={"max_tokens": 8}, **kw)


async def rollout(env: Environment, proxy: Proxy, **kw: Any) -> Trace:
    ep = Episode()
    out = await run_rollout(env, TASK, proxy=proxy, episode=ep, model=MODEL_NAME, **kw)
    assert out is ep and ep.task_key == "t0" and ep.env == "t"
    (trace,) = ep.traces
    assert trace.completed
    assert "phase" not in trace.info
    return trace


def spans(trace: Trace) -> list[str]:
    for span in trace.timing.values():
        assert span.end is not None and span.end >= span.start
    return list(trace.timing)


async def test_clean_rollout(proxy: Proxy, template: ChatTemplate) -> None:
    trace = await rollout(make_env(), proxy)
    assert trace.ok and trace.stop == "done" and not trace.errors
    assert spans(trace) == ["boot", "setup", "agent", "finalize", "scoring"]
    assert "is_paris" in trace.rewards
    assert check_token_exact(trace, template) == len(trace.calls) == 1
    # The session is gone once the rollout ends.
    assert trace.info["session"] not in proxy.registry


@pytest.mark.parametrize(
    ("kw", "stop", "phases"),
    [
        ({"setup": hang}, "setup_timeout", ["boot", "setup", "finalize", "scoring"]),
        ({"setup": boom}, "setup_error", ["boot", "setup", "finalize", "scoring"]),
        ({"harness": ChatHarness(respond=hang)}, "agent_timeout", None),
        ({"harness": ChatHarness(respond=boom)}, "agent_error", None),
        ({"finalize": hang}, "finalize_timeout", None),
        ({"finalize": boom}, "finalize_error", None),
        ({"harness": BootFails()}, "boot_error", ["boot", "scoring"]),
    ],
)
async def test_phase_failures_are_recorded(
    proxy: Proxy, kw: dict[str, Any], stop: str, phases: list[str] | None
) -> None:
    phase = stop.rsplit("_", 1)[0]
    timeouts = GENEROUS.replace(**{phase: SHORT}) if stop.endswith("timeout") else None
    trace = await rollout(make_env(**kw), proxy, timeouts=timeouts)
    assert trace.stop == stop
    assert not trace.ok
    assert [e.phase for e in trace.errors] == [phase]
    want_type = "PhaseTimeout" if stop.endswith("timeout") else None
    if want_type:
        assert trace.errors[0].type == want_type
    assert spans(trace) == (phases or ["boot", "setup", "agent", "finalize", "scoring"])
    assert "is_paris" in trace.rewards  # scoring still ran


async def test_scoring_failures(proxy: Proxy) -> None:
    async def slow_metric(task: Task, trace: Trace) -> float:
        await asyncio.sleep(30)
        return 0.0

    trace = await rollout(make_env(metrics=[boom]), proxy)
    assert trace.stop == "scoring_error"
    assert trace.errors[0].phase == "scoring" and "boom" in trace.errors[0].message
    assert "is_paris" in trace.rewards  # the other functions still count

    trace = await rollout(make_env(metrics=[slow_metric]), proxy,
                          timeouts=GENEROUS.replace(scoring=SHORT))
    assert trace.stop == "scoring_timeout"


async def test_timeouts_override(proxy: Proxy) -> None:
    env = make_env(setup=lambda t, r: __import__("time").sleep(0.5),
                   timeouts=GENEROUS.replace(setup=SHORT))
    assert (await rollout(env, proxy)).stop == "setup_timeout"
    trace = await rollout(env, proxy, timeouts=GENEROUS.replace(setup=5))
    assert trace.ok and trace.stop == "done"


class Flaky(ChatHarness):
    def __init__(self, fails: int, exc: type[Exception]) -> None:
        super().__init__()
        self.fails, self.exc = fails, exc

    async def run(self, rollout: Rollout) -> None:
        await super().run(rollout)  # a real turn, so the abandoned trace has content
        if self.fails:
            self.fails -= 1
            raise self.exc("flaky")


async def test_retries_discard_abandoned_attempts(proxy: Proxy) -> None:
    env = make_env(harness=Flaky(2, ConnectionError), retries=3, retry_on=[ConnectionError])
    ep = Episode()
    await run_rollout(env, TASK, proxy=proxy, episode=ep, model=MODEL_NAME)
    (trace,) = ep.traces
    assert trace.ok and trace.stop == "done" and trace.info["attempt"] == 2
    assert ep.info["retries"] == 2 and len(trace.calls) == 1

    # Not a retryable error type: recorded, no retry.
    env = make_env(harness=Flaky(1, ValueError), retries=3, retry_on=["ConnectionError"])
    ep = Episode()
    await run_rollout(env, TASK, proxy=proxy, episode=ep, model=MODEL_NAME)
    (trace,) = ep.traces
    assert trace.stop == "agent_error" and "retries" not in ep.info

    # Retries run out: the last attempt is kept with its error.
    env = make_env(harness=Flaky(5, ConnectionError), retries=1, retry_on=[OSError])
    ep = Episode()
    await run_rollout(env, TASK, proxy=proxy, episode=ep, model=MODEL_NAME)
    (trace,) = ep.traces
    assert trace.stop == "agent_error" and ep.info["retries"] == 1


async def test_failing_subprocess(proxy: Proxy) -> None:
    code = "import sys; sys.stderr.write('bad things\\n'); sys.exit(3)"
    env = make_env(harness=CommandHarness(["{python}", "-c", code]))
    trace = await rollout(env, proxy, timeouts=GENEROUS.replace(agent=30))
    assert trace.stop == "agent_error"
    (err,) = trace.errors
    assert err.type == "CommandFailed" and "exit code 3" in err.message
    assert "bad things" in err.message
    info = trace.info["command"]
    assert info["exit_code"] == 3 and info["stderr"] == "bad things\n"


async def test_missing_program(proxy: Proxy) -> None:
    env = make_env(harness=CommandHarness(["/nonexistent/agent-binary"]))
    trace = await rollout(env, proxy)
    assert trace.stop == "agent_error" and "cannot start" in trace.errors[0].message


async def test_hanging_subprocess_is_killed(proxy: Proxy, tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    code = ("import os, subprocess, sys, time; "
            "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            f"open({str(pidfile)!r}, 'w').write(str(c.pid)); time.sleep(60)")
    env = make_env(harness=CommandHarness(["{python}", "-c", code]))
    trace = await rollout(env, proxy, timeouts=GENEROUS.replace(agent=1.5))
    assert trace.stop == "agent_timeout"
    assert trace.info["command"]["killed"] is True
    child = int(pidfile.read_text())
    # The grandchild was in the agent's process group, so it is gone (or a zombie) too.
    for _ in range(50):
        try:
            os.kill(child, 0)
            state = Path(f"/proc/{child}/stat").read_text().split()[2]  # noqa: ASYNC240
            if state == "Z":
                break
        except (ProcessLookupError, FileNotFoundError):
            break
        await asyncio.sleep(0.05)
    else:
        pytest.fail("grandchild survived the agent timeout")


async def test_command_env_vars_and_task_file(proxy: Proxy) -> None:
    code = ("import json, os, sys; t = json.load(open(os.environ['TRACEWIRE_TASK_FILE'])); "
            "s = sys.stdin.read(); print(json.dumps({k: os.environ[k] for k in "
            "['OPENAI_BASE_URL', 'OPENAI_API_KEY', 'ANTHROPIC_BASE_URL', 'ANTHROPIC_API_KEY']}"
            " | {'same': json.loads(s) == t, 'key': t['key']}))")
    env = make_env(harness=CommandHarness([sys.executable, "-c", code]))
    trace = await rollout(env, proxy, timeouts=GENEROUS.replace(agent=30))
    assert trace.ok, trace.errors
    got = __import__("json").loads(trace.info["command"]["stdout"])
    sid = trace.info["session"]
    assert got["OPENAI_BASE_URL"].endswith(f"/sessions/{sid}/v1")
    assert got["ANTHROPIC_BASE_URL"].endswith(f"/sessions/{sid}")
    assert got["OPENAI_API_KEY"] == got["ANTHROPIC_API_KEY"] != ""
    assert got["same"] is True and got["key"] == "t0"
