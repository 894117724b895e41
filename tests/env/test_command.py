"""CommandHarness: what it records when the agent program is stopped early, on the host."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

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


# Without a runtime the program runs in the harness's own LocalRuntime; what it records
# must stay what a host subprocess always recorded: these pin the keys and their order.
async def test_host_program_record_has_its_pid_and_no_runtime(proxy: Proxy) -> None:
    code = "import sys; print(sys.argv[1]); sys.stderr.write('e\\n')"
    env = Environment("t", tasks=[TASK],
                      harness=CommandHarness([sys.executable, "-c", code, "{workdir}"]),
                      timeouts=GENEROUS)
    trace = await one(env, proxy)
    assert trace.ok, trace.errors
    info = trace.info["command"]
    assert list(info) == ["argv", "pid", "exit_code", "stdout", "stderr"]
    assert info["exit_code"] == 0 and info["stderr"] == "e\n"
    workdir = info["stdout"].strip()
    assert info["argv"][-1] == workdir and os.path.basename(workdir).startswith("tracewire-cmd-")
    assert not os.path.exists(workdir)  # noqa: ASYNC240 - removed at cleanup
    assert not any(k.startswith("runtime_") for k in trace.timing)
    with pytest.raises(ProcessLookupError):
        os.kill(info["pid"], 0)


async def test_host_program_killed_at_the_deadline(proxy: Proxy) -> None:
    env = Environment("t", tasks=[TASK], harness=CommandHarness([sys.executable, "-c",
                                                                 CHATTY_HANG]),
                      timeouts=GENEROUS.replace(agent=1.5))
    trace = await one(env, proxy)
    assert trace.stop == "agent_timeout"
    assert list(trace.info["command"]) == ["argv", "pid", "killed", "stdout", "stderr"]


async def test_host_program_whose_child_holds_its_pipes_is_killed_at_the_deadline(
    proxy: Proxy,
) -> None:
    # The program exits at once, but a child it started keeps stdout open: asyncio reports
    # the exit only when the pipes close, so the rollout waits until the deadline, kills
    # the group (the child too) and records no exit status, as a host subprocess always did.
    code = ("import subprocess, sys; subprocess.Popen([sys.executable, '-c', "
            "'import time; time.sleep(60)']); print('leader done', flush=True)")
    env = Environment("t", tasks=[TASK], harness=CommandHarness([sys.executable, "-c", code]),
                      timeouts=GENEROUS.replace(agent=1.5))
    trace = await one(env, proxy)
    assert trace.stop == "agent_timeout"
    info = trace.info["command"]
    assert list(info) == ["argv", "pid", "killed", "stdout", "stderr"]
    assert info["stdout"] == "leader done\n"


async def test_host_program_that_cannot_start_is_an_env_error(proxy: Proxy) -> None:
    env = Environment("t", tasks=[TASK], harness=CommandHarness(["/nonexistent/agent-binary"]),
                      timeouts=GENEROUS)
    trace = await one(env, proxy)
    (err,) = trace.errors
    assert err.type == "EnvError"
    assert err.message.startswith("cannot start '/nonexistent/agent-binary': [Errno 2]")
    assert trace.info["command"] == {"argv": ["/nonexistent/agent-binary"]}


async def test_host_program_relative_cwd_is_below_this_process_cwd(
    proxy: Proxy, tmp_path: Path, monkeypatch: Any,
) -> None:
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path)
    code = "import os; print(os.getcwd())"
    env = Environment("t", tasks=[TASK],
                      harness=CommandHarness([sys.executable, "-c", code], cwd="sub"),
                      timeouts=GENEROUS)
    trace = await one(env, proxy)
    assert trace.ok, trace.errors
    assert trace.info["command"]["stdout"].strip() == str(tmp_path / "sub")
