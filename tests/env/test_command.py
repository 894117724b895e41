"""CommandHarness: what it records when the agent program is stopped early, on the host."""

from __future__ import annotations

import sys
from typing import Any

from tracewire.env import CommandHarness, Environment, Task, Timeouts, run_rollout
from tracewire.model import MODEL_NAME
from tracewire.proxy import Proxy
from tracewire.trace import Episode, Trace

TASK = Task("t0", {"prompt": "hi"})
GENEROUS = Timeouts(boot=10, setup=10, agent=10, finalize=10, scoring=10)
# Prints to both streams, flushes, then hangs past the agent deadline.
CHATTY_HANG = ("import sys, time; print('partial-out', flush=True); "
               "sys.stderr.write('partial-err\\n'); sys.stderr.flush(); time.sleep(60)")


async def one(env: Environment, proxy: Proxy) -> Trace:
    ep = Episode()
    await run_rollout(env, TASK, proxy=proxy, episode=ep, model=MODEL_NAME)
    (trace,) = ep.traces
    return trace


async def test_timed_out_agent_keeps_what_it_printed(proxy: Proxy) -> None:
    env = Environment("t", tasks=[TASK], harness=CommandHarness([sys.executable, "-c",
                                                                 CHATTY_HANG]),
                      timeouts=GENEROUS.replace(agent=2.0))
    trace = await one(env, proxy)
    assert trace.stop == "agent_timeout"
    info = trace.info["command"]
    assert info["killed"] is True
    assert "partial-out" in info["stdout"] and "partial-err" in info["stderr"]


async def test_agent_never_sees_the_trainer_token(proxy: Proxy, monkeypatch: Any) -> None:
    monkeypatch.setenv("TRACEWIRE_SESSION_TOKEN", "trainer-secret")
    monkeypatch.setenv("TW_VISIBLE", "yes")
    code = ("import os; print(os.environ.get('TRACEWIRE_SESSION_TOKEN', '-'), "
            "os.environ.get('TW_VISIBLE', '-'))")
    env = Environment("t", tasks=[TASK], harness=CommandHarness([sys.executable, "-c", code]),
                      timeouts=GENEROUS)
    trace = await one(env, proxy)
    assert trace.ok, trace.errors
    assert trace.info["command"]["stdout"].split() == ["-", "yes"]
