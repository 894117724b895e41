"""Sandboxes bounded and reaped, on real bwrap: the relay survives a fork bomb, a disk bound
stops a writer, a SIGKILLed harness leaves nothing after the next start, and cgroups sit
below the process that made them."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tracewire.compose import runtime_factory
from tracewire.env import CommandHarness, Environment, Task, Timeouts, run_rollout
from tracewire.model import MODEL_NAME
from tracewire.proxy import Proxy
from tracewire.runtime import BwrapRuntime, Limits, ProxyEndpoint, ResourceLimitExceeded
from tracewire.trace import Episode

from .conftest import PYTHON, agent_file, needs_bwrap, procs_with

pytestmark = needs_bwrap
MiB = 1 << 20


def _own_cgroup_dirs() -> dict[str, Path]:
    """This process's v1 cgroup directories, read here independently of the runtime."""
    out = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        for c in ctrls.split(","):
            if c in ("pids", "memory") and Path("/sys/fs/cgroup", c).is_dir():
                out[c] = Path("/sys/fs/cgroup", c) / path.lstrip("/")
    return out


def _skip_without_cgroups(rt: BwrapRuntime) -> None:
    if rt.cgroup is None:
        pytest.skip("no cgroup can be made here (not root, or no delegated controllers)")


async def test_fork_bomb_then_recover_still_reaches_the_proxy(proxy: Proxy) -> None:
    session = proxy.create_session()
    async with BwrapRuntime(endpoint=ProxyEndpoint.from_session(session),
                            limits=Limits(processes=40)) as rt:
        _skip_without_cgroups(rt)
        await rt.put_files({"agent.py": agent_file("exhaust_agent.py")})
        res = await rt.exec([PYTHON, "agent.py", MODEL_NAME], timeout=120)
    assert not res.timed_out, res.to_info()
    out = json.loads(res.stdout.decode().strip().splitlines()[-1])
    assert out["children"] > 10, out  # the limit was really reached
    # During exhaustion the call got an answer (or a refusal), never a hang...
    assert out["during"]["status"] is not None, out
    # ...and after it the relay still serves: the call reached the proxy and was recorded.
    assert out["after"]["status"] == 200, out
    assert session.trace.calls and session.trace.calls[-1].error is None
    assert res.ok and res.extra["limits_hit"]["processes"] > 0, res.to_info()


_ONE_CALL = """
import json, os, sys, urllib.error, urllib.request
req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/models",
                             headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
try:
    with urllib.request.urlopen(req, timeout=30) as r:
        print(json.dumps({"status": r.status}))
except urllib.error.HTTPError as exc:
    print(json.dumps({"status": exc.code, "body": exc.read().decode()}))
"""


async def test_a_call_the_relay_cannot_take_fails_at_once_and_is_recorded(proxy: Proxy) -> None:
    session = proxy.create_session()
    async with BwrapRuntime(endpoint=ProxyEndpoint.from_session(session)) as rt:
        assert rt.relay is not None
        await rt.relay.stop()  # the host end is gone: the launcher cannot connect to it
        res = await rt.exec([PYTHON, "-c", _ONE_CALL], timeout=60)
    assert res.ok, res.to_info()
    out = json.loads(res.stdout.decode().strip().splitlines()[-1])
    assert out["status"] == 503 and "cannot reach the host end" in out["body"], out
    (note,) = res.extra["relay_errors"]
    assert "cannot reach the host end of the relay" in note


async def test_writer_past_disk_bytes_is_stopped_and_the_host_sees_at_most_the_bound() -> None:
    bound = 8 * MiB
    script = ("dd if=/dev/zero of=/workspace/a bs=1M count=64 2>/dev/null; "
              "dd if=/dev/zero of=/tmp/b bs=1M count=64 2>/dev/null; "
              "echo still-running; sleep 300")
    async with BwrapRuntime(limits=Limits(disk_bytes=bound)) as rt:
        res = await rt.exec(["/bin/sh", "-c", script], timeout=120)
        disk = rt.disk_dir
        assert disk is not None
        used = sum(p.stat().st_size for p in disk.rglob("*") if p.is_file())
        st = os.statvfs(disk)
    assert not res.timed_out, res.to_info()  # stopped by the bound, not the timeout
    assert res.limit == "disk", res.to_info()
    err = res.error()
    assert isinstance(err, ResourceLimitExceeded) and err.limit == "disk"
    assert 0 < used <= bound
    assert st.f_blocks * st.f_frsize <= bound


async def test_disk_limit_is_recorded_on_the_episode(proxy: Proxy) -> None:
    task = Task("t0", {"prompt": "fill"})
    factory = runtime_factory("bwrap", limits=Limits(disk_bytes=4 * MiB))
    env = Environment(
        "disk", tasks=[task], timeouts=Timeouts(boot=30, setup=30, agent=60, finalize=30,
                                                scoring=30),
        harness=CommandHarness(["/bin/sh", "-c", "cat /dev/zero > /tmp/fill; sleep 300"],
                               runtime=factory))
    ep = Episode()
    await run_rollout(env, task, proxy=proxy, episode=ep, model=MODEL_NAME)
    (trace,) = ep.traces
    assert trace.stop == "agent_error"
    (err,) = trace.errors
    assert err.type == "ResourceLimitExceeded" and "disk" in err.message
    assert trace.info["command"]["limit"] == "disk"


# A harness in its own process: boots a sandbox with a cgroup and a disk bound, starts a
# long command in it, prints where everything is, then waits to be killed.
_HARNESS = """
import asyncio, json, sys
from tracewire.runtime import BwrapRuntime, Limits

async def main():
    rt = BwrapRuntime(limits=Limits(processes=64, disk_bytes=4 << 20))
    await rt.boot()
    task = asyncio.ensure_future(rt.exec(["/bin/sh", "-c", sys.argv[1]], timeout=600))
    while rt.last_result is None or b"started" not in rt.last_result.stdout:
        await asyncio.sleep(0.05)
    print(json.dumps({"state": str(rt.disk_dir.parent),
                      "cgroups": [str(d) for d in rt.cgroup.dirs.values()] if rt.cgroup
                      else []}), flush=True)
    await task

asyncio.run(main())
"""


def _start_harness(marker: str) -> tuple[subprocess.Popen[str], dict[str, object]]:
    script = f"echo started; (sleep 600; : {marker}) & sleep 600 # {marker}"
    proc = subprocess.Popen([sys.executable, "-c", _HARNESS, script], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, "the harness did not start its sandbox"
    return proc, json.loads(line)


def _janitor_of(pid: int) -> list[int]:
    """Pids of the janitor watching ``pid`` (``… _reap.py watch TMPDIR PID``)."""
    found = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                parts = Path(f"/proc/{p}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
            except OSError:
                continue
            if len(parts) >= 3 and parts[-3] == b"watch" and parts[-1] == str(pid).encode():
                found.append(int(p))
    return found


def _end(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def _left(where: dict[str, object], marker: str) -> list[str]:
    state = Path(str(where["state"]))
    cgroups = [Path(str(c)) for c in where["cgroups"]]  # type: ignore[attr-defined]
    return ([str(state)] * state.exists() + [str(c) for c in cgroups if c.exists()]
            + procs_with(marker))


async def _wait_clean(where: dict[str, object], marker: str) -> list[str]:
    for _ in range(200):
        if not _left(where, marker):
            break
        await asyncio.sleep(0.05)
    return _left(where, marker)


async def test_sigkilled_harness_leaves_nothing_after_the_next_start() -> None:
    marker = "tw-reap-" + secrets.token_hex(4)
    proc, where = await asyncio.to_thread(_start_harness, marker)
    try:
        assert where["cgroups"], "the harness got no cgroup (not root?)"
        assert procs_with(marker) and _left(where, marker)
        # Its janitor is killed first, so only the next start can clean up.
        janitors = _janitor_of(proc.pid)
        assert janitors
        for j in janitors:
            os.kill(j, signal.SIGKILL)
        proc.kill()
        await asyncio.to_thread(proc.wait)
        assert Path(str(where["state"])).exists()  # nothing cleaned it yet  # noqa: ASYNC240
        async with BwrapRuntime():  # the next start
            pass
        assert await _wait_clean(where, marker) == []
        assert not any(str(where["state"]) in line
                       for line in Path("/proc/self/mountinfo").read_text().splitlines())  # noqa: ASYNC240
    finally:
        _end(proc)


_EVAL_ENV = """
from tracewire.compose import runtime_factory
from tracewire.env import CommandHarness, Environment, Task, Timeouts
from tracewire.runtime import Limits

env = Environment("sleepy", tasks=[Task("t0", {{}})], timeouts=Timeouts(agent=600),
                  harness=CommandHarness(["/bin/sh", "-c", {script!r}], runtime=runtime_factory(
                      "bwrap", limits=Limits(processes=64, disk_bytes=4 << 20))))
"""


def _owned_by(pid: int) -> list[dict[str, object]]:
    """The sandbox directories whose owner lock names ``pid``, with what they list."""
    found = []
    tmp = Path(tempfile.gettempdir())
    for d in tmp.glob("tw-bwrap-*"):
        try:
            info = json.loads((d / "owner.lock").read_text())
        except (OSError, ValueError):
            continue
        if info.get("pid") == pid:
            found.append({"state": str(d), "cgroups": info.get("cgroups", [])})
    return found


async def test_sigkilled_eval_mid_rollout_leaves_nothing_after_the_next_start(
        tmp_path: Path) -> None:
    """``tracewire eval`` (model, proxy, rollout, sandbox in one process) SIGKILLed while
    its agent runs; its janitor is killed too, so the next start must clean up."""
    marker = "tw-evalkill-" + secrets.token_hex(4)
    env_file = tmp_path / "sleepy_env.py"
    env_file.write_text(_EVAL_ENV.format(script=f"(sleep 600; : {marker}) & sleep 600 # {marker}"))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tracewire", "eval", str(env_file), "-q", "--out",
        str(tmp_path / "run"), stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL)
    try:
        for _ in range(1200):
            if procs_with(marker) or proc.returncode is not None:
                break
            await asyncio.sleep(0.05)
        assert procs_with(marker), "the rollout's agent never started"
        (where,) = _owned_by(proc.pid)
        assert where["cgroups"] and _left(where, marker)
        for j in _janitor_of(proc.pid):
            os.kill(j, signal.SIGKILL)
        proc.kill()
        await proc.wait()
        async with BwrapRuntime():  # the next start
            pass
        assert await _wait_clean(where, marker) == []
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_sigkilled_harness_is_cleaned_by_its_janitor() -> None:
    marker = "tw-janitor-" + secrets.token_hex(4)
    proc, where = await asyncio.to_thread(_start_harness, marker)
    try:
        assert _left(where, marker)
        proc.kill()
        await asyncio.to_thread(proc.wait)
        # No new start here: the harness's janitor notices it died and reaps.
        assert await _wait_clean(where, marker) == []
    finally:
        _end(proc)


async def test_a_live_sandbox_is_not_reaped_by_another_start() -> None:
    async with BwrapRuntime(limits=Limits(processes=16)) as rt:
        state = rt.host_workdir().parent.parent
        other = await asyncio.to_thread(subprocess.run, [
            sys.executable, "-c", "import asyncio\nfrom tracewire.runtime import BwrapRuntime\n"
            "async def m():\n    async with BwrapRuntime():\n        pass\nasyncio.run(m())"],
            check=True)
        assert other.returncode == 0
        assert state.exists() and rt.host_workdir().is_dir()
        res = await rt.exec(["/bin/sh", "-c", "echo ok"], timeout=30)
        assert res.ok and res.stdout == b"ok\n"


async def test_sandbox_cgroups_sit_under_this_process_own() -> None:
    own = _own_cgroup_dirs()
    async with BwrapRuntime(limits=Limits(processes=32, memory_bytes=256 * MiB)) as rt:
        _skip_without_cgroups(rt)
        assert rt.cgroup is not None
        dirs = dict(rt.cgroup.dirs)
        res = await rt.exec(["/bin/cat", "/proc/self/cgroup"], timeout=30)
    assert res.ok, res.to_info()
    assert set(dirs) == set(own) and dirs
    for ctrl, d in dirs.items():
        assert d.parent == own[ctrl], (ctrl, d, own[ctrl])


_CHILD = """
import asyncio, json
from tracewire.runtime import BwrapRuntime, Limits
async def main():
    async with BwrapRuntime(limits=Limits(processes=32, memory_bytes=256 << 20)) as rt:
        print(json.dumps({k: str(v) for k, v in rt.cgroup.dirs.items()}))
asyncio.run(main())
"""


async def test_cgroups_of_a_harness_in_a_nested_cgroup_nest_below_it() -> None:
    """The harness is moved into a fresh cgroup of each hierarchy first: its sandboxes'
    cgroups must then be made below that one, not at the hierarchy's root."""
    own = _own_cgroup_dirs()
    if not own or not os.access(next(iter(own.values())), os.W_OK):
        pytest.skip("cannot make cgroups here")
    name = "tw-test-" + secrets.token_hex(4)
    made = {c: d / name for c, d in own.items()}
    for d in made.values():
        d.mkdir()
    procs = " ".join(f'echo $$ > "{d}/cgroup.procs" &&' for d in made.values())
    try:
        out = await asyncio.to_thread(subprocess.run, [
            "/bin/sh", "-c", f'{procs} exec "$@"', "sh", sys.executable, "-c", _CHILD],
            capture_output=True, text=True, check=True)
        dirs = json.loads(out.stdout)
        assert set(dirs) == set(made)
        for ctrl, d in dirs.items():
            assert Path(d).parent == made[ctrl], (d, made[ctrl])
            assert not Path(d).exists()  # noqa: ASYNC240  (removed at close)
    finally:
        for d in made.values():
            await asyncio.to_thread(_rmdir_when_empty, d)


def _rmdir_when_empty(d: Path) -> None:
    # The child's janitor (in the same cgroup) exits just after the child does.
    for _ in range(100):
        try:
            d.rmdir()
            return
        except OSError:
            time.sleep(0.05)
    d.rmdir()
