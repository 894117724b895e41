"""CommandHarness with a runtime: real proxy, real built-in model, real openai SDK, real
bwrap. The runtime is booted in the boot phase and closed on every path out; what the agent
printed is on the trace even when it is stopped; finalize and scoring run commands in it."""

from __future__ import annotations

import asyncio
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tracewire import EnvError
from tracewire.compose import evaluate, runtime_factory, with_runtime
from tracewire.env import (
    ChatHarness,
    CommandHarness,
    Environment,
    Rollout,
    Task,
    Timeouts,
    load_environment,
    run_rollout,
    runtime_of,
)
from tracewire.model import MODEL_NAME
from tracewire.proxy import Proxy
from tracewire.runtime import BwrapRuntime, Limits
from tracewire.trace import Episode, Trace

from .conftest import agent_file, needs_bwrap, procs_with

TASK = Task("t0", {"prompt": "count"})
GENEROUS = Timeouts(boot=30, setup=30, agent=120, finalize=30, scoring=30)
TURNS = 3
#: A child the agent starts, found on the host by the marker after it in its argv.
LINGER = "import time; time.sleep(300)"


def lingering(marker: str) -> bool:
    """Whether the agent's child (not the agent: its argv holds the marker too) runs."""
    return any(f"{LINGER} {marker}" in cmd for cmd in procs_with(marker))


async def wait_for_child(marker: str, task: asyncio.Task[Any]) -> None:
    for _ in range(400):
        if lingering(marker) or task.done():
            break
        await asyncio.sleep(0.05)
    assert lingering(marker), "the agent never started its child"


def chat_env(runtime: Any, **kw: Any) -> Environment:
    """The multi-turn openai-SDK agent, copied into the workdir."""
    harness = CommandHarness(["{python}", "{workdir}/agent.py", str(TURNS)], runtime=runtime,
                             files=lambda _t: {"agent.py": agent_file("chat_agent.py")})
    kw.setdefault("timeouts", GENEROUS)
    return Environment("rt", tasks=[TASK], harness=harness, **kw)


async def one(env: Environment, proxy: Proxy) -> Trace:
    ep = Episode()
    await run_rollout(with_runtime(env), TASK, proxy=proxy, episode=ep, model=MODEL_NAME)
    (trace,) = ep.traces
    return trace


def token_ids(trace: Trace) -> list[list[int]]:
    return [trace.branch(c.node).ids.tolist() for c in trace.calls if c.node is not None]


def check_completed(trace: Trace, runtime: str) -> None:
    assert trace.ok, (trace.errors, trace.info.get("command"))
    info = trace.info["command"]
    assert info["runtime"] == runtime and info["exit_code"] == 0
    assert '"answers"' in info["stdout"]
    assert len(trace.calls) == TURNS and all(c.error is None for c in trace.calls)
    assert trace.info.get("token_mismatches", 0) == 0
    for phase in ("runtime_boot", "runtime_close"):
        span = trace.timing[phase]
        assert span.end is not None and span.end >= span.start
    # The runtime is booted inside the boot phase (monotonic vs wall clock: a little slack).
    boot, rt_boot = trace.timing["boot"], trace.timing["runtime_boot"]
    assert boot.end is not None and rt_boot.end is not None
    assert boot.start - 0.05 <= rt_boot.start and rt_boot.end <= boot.end + 0.05


async def test_local_runtime_runs_a_multi_turn_agent(proxy: Proxy) -> None:
    trace = await one(chat_env("local"), proxy)
    check_completed(trace, "local")


@needs_bwrap
async def test_bwrap_records_the_same_tokens_as_local(proxy: Proxy) -> None:
    local = await one(chat_env("local"), proxy)
    boxed = await one(chat_env("bwrap"), proxy)
    check_completed(boxed, "bwrap")
    assert token_ids(boxed) == token_ids(local) and token_ids(local)


@needs_bwrap
async def test_timed_out_agent_in_bwrap_keeps_output_and_leaves_nothing(proxy: Proxy) -> None:
    marker = "tw-hang-" + secrets.token_hex(4)
    code = (f"import subprocess, sys, time; print('partial {marker}', flush=True); "
            f"subprocess.Popen([sys.executable, '-c', {LINGER!r}, '{marker}']); time.sleep(300)")
    dirs: list[Path] = []

    async def note_dir(task: Task, rollout: Rollout) -> None:
        assert rollout.runtime is not None and rollout.workdir is not None
        dirs.append(rollout.workdir)

    env = Environment("rt", tasks=[TASK], setup=note_dir,
                      harness=CommandHarness(["{python}", "-c", code], runtime="bwrap"),
                      timeouts=GENEROUS.replace(agent=4.0))
    ep = Episode()
    task = asyncio.create_task(run_rollout(with_runtime(env), TASK, proxy=proxy, episode=ep,
                                           model=MODEL_NAME))
    await wait_for_child(marker, task)
    await task
    (trace,) = ep.traces
    assert trace.stop == "agent_timeout"
    info = trace.info["command"]
    assert info["killed"] is True and f"partial {marker}" in info["stdout"]
    assert procs_with(marker) == []
    assert dirs and not dirs[0].exists()
    assert runtime_of(trace) is None


@needs_bwrap
async def test_finalize_and_scoring_run_commands_in_the_sandbox(proxy: Proxy) -> None:
    # The agent writes its answer; finalize runs the task's check inside the sandbox, and a
    # reward reads a file out of it through runtime_of(trace).
    code = "open('answer.txt', 'w').write('42\\n')"
    check = "import sys; sys.exit(0 if open('answer.txt').read().strip() == '42' else 1)"

    async def run_check(task: Task, rollout: Rollout) -> None:
        assert rollout.runtime is not None
        res = await rollout.runtime.exec(["python3", "-c", check])
        rollout.trace.info["check_exit"] = res.exit_code

    async def answer_is_42(task: Task, trace: Trace) -> float:
        rt = runtime_of(trace)
        assert rt is not None
        files = await rt.get_files(["answer.txt", "missing.txt"])
        return 1.0 if files == {"answer.txt": b"42\n"} else 0.0

    env = Environment("rt", tasks=[TASK], finalize=run_check, rewards=[answer_is_42],
                      harness=CommandHarness(["python3", "-c", code], runtime="bwrap"),
                      timeouts=GENEROUS)
    trace = await one(env, proxy)
    assert trace.ok, trace.errors
    assert trace.info["check_exit"] == 0 and trace.reward == 1.0


@needs_bwrap
async def test_memory_hog_is_recorded_as_the_rollouts_error(proxy: Proxy) -> None:
    probe = BwrapRuntime(limits=Limits(memory_bytes=128 << 20))
    async with probe:
        if probe.cgroup is None or "memory" not in probe.cgroup.counters():
            pytest.skip("no memory cgroup can be made here; the rlimit fallback makes the "
                        "agent's own MemoryError, not a limit")
    hog = "x = []\nwhile True:\n    x.append(bytearray(16 << 20))\n"
    factory = runtime_factory("bwrap", limits=Limits(memory_bytes=128 << 20))
    env = Environment("rt", tasks=[TASK], timeouts=GENEROUS,
                      harness=CommandHarness(["python3", "-c", hog], runtime=factory))
    trace = await one(env, proxy)
    assert trace.stop == "agent_error"
    (err,) = trace.errors
    assert err.type == "ResourceLimitExceeded" and "memory" in err.message
    assert trace.info["command"]["limit"] == "memory"


async def test_a_runtime_name_outside_the_composition_root_is_a_clear_boot_error(
        proxy: Proxy) -> None:
    env = Environment("rt", tasks=[TASK], timeouts=GENEROUS,
                      harness=CommandHarness(["true"], runtime="bwrap"))
    ep = Episode()
    await run_rollout(env, TASK, proxy=proxy, episode=ep, model=MODEL_NAME)
    (trace,) = ep.traces
    assert trace.stop == "boot_error" and "runtime_factory('bwrap')" in trace.errors[0].message


def test_with_runtime_overrides_and_leaves_the_original_alone() -> None:
    env = chat_env(None)
    boxed = with_runtime(env, "bwrap")
    assert boxed is not env and callable(boxed.harness.runtime)  # type: ignore[attr-defined]
    assert env.harness.runtime is None  # type: ignore[attr-defined]
    assert with_runtime(env) is env
    chat = Environment("c", tasks=[TASK], harness=ChatHarness())
    with pytest.raises(EnvError, match="command harnesses"):
        with_runtime(chat, "local")
    with pytest.raises(EnvError, match="unknown runtime"):
        runtime_factory("chroot")


@needs_bwrap
async def test_evaluate_runs_the_bundled_command_env_in_bwrap(tmp_path: Path) -> None:
    env = load_environment("command")
    result = await evaluate(env, n=2, out=tmp_path / "run", runtime="bwrap", concurrency=2)
    episodes = list(result.run)
    assert len(episodes) == 2 and result.run.meta["config"]["runtime"] == "bwrap"
    for ep in episodes:
        (trace,) = ep.traces
        assert trace.ok, trace.errors
        assert trace.info["command"]["runtime"] == "bwrap"
        assert trace.calls and trace.info.get("token_mismatches", 0) == 0


def test_cli_eval_offers_runtime() -> None:
    out = subprocess.run([sys.executable, "-m", "tracewire", "eval", "--help"],
                         capture_output=True, text=True, check=True).stdout
    assert "--runtime {local,bwrap,docker}" in " ".join(out.split())
    bad = subprocess.run([sys.executable, "-m", "tracewire", "eval", "command", "--runtime",
                          "chroot"], capture_output=True, text=True)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr


async def test_local_runtime_keeps_the_trainer_token_from_the_agent(
        proxy: Proxy, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEWIRE_SESSION_TOKEN", "trainer-secret")
    code = "import os; print(os.environ.get('TRACEWIRE_SESSION_TOKEN', '-'))"
    env = Environment("rt", tasks=[TASK], timeouts=GENEROUS,
                      harness=CommandHarness([sys.executable, "-c", code], runtime="local"))
    trace = await one(env, proxy)
    assert trace.ok, trace.errors
    assert trace.info["command"]["stdout"].strip() == "-"


@needs_bwrap
async def test_cancelled_rollout_leaves_no_process_and_no_files(proxy: Proxy) -> None:
    marker = "tw-cancel-" + secrets.token_hex(4)
    code = (f"import subprocess, sys, time; print('started', flush=True); "
            f"subprocess.Popen([sys.executable, '-c', {LINGER!r}, '{marker}']); time.sleep(300)")
    seen: list[Rollout] = []

    async def note(task: Task, rollout: Rollout) -> None:
        seen.append(rollout)

    env = Environment("rt", tasks=[TASK], setup=note, timeouts=GENEROUS,
                      harness=CommandHarness(["python3", "-c", code], runtime="bwrap"))
    ep = Episode()
    task = asyncio.create_task(run_rollout(with_runtime(env), TASK, proxy=proxy, episode=ep,
                                           model=MODEL_NAME))
    await wait_for_child(marker, task)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    (rollout,) = seen
    assert procs_with(marker) == []
    assert rollout.workdir is not None and not rollout.workdir.exists()
    assert ep.traces[0].info["command"]["killed"] is True
    assert "started" in ep.traces[0].info["command"]["stdout"]


@needs_bwrap
async def test_env_server_runner_takes_the_runtime_option() -> None:
    from tracewire.compose import env_factory

    task = next(load_environment("command").tasks())
    async with env_factory("command", {"runtime": "bwrap"}) as run:
        ep = Episode()
        await run({"key": task.key, **task.data}, ep)
    (trace,) = ep.traces
    assert trace.ok, trace.errors
    assert trace.info["command"]["runtime"] == "bwrap" and trace.calls
