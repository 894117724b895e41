"""An agent inside bubblewrap: real proxy, real built-in model, real openai SDK, real
bwrap; what it records, and what it cannot reach."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import tempfile
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest

from tracewire.model import MODEL_NAME
from tracewire.proxy import Proxy
from tracewire.runtime import (
    BwrapRuntime,
    Limits,
    LocalRuntime,
    ProxyEndpoint,
    ResourceLimitExceeded,
    Runtime,
)

from .conftest import PYTHON, VENV, VENV_PYTHON, agent_file, needs_bwrap, procs_with

pytestmark = needs_bwrap
TURNS = 4


async def _run_agent(proxy: Proxy, rt_cls: type[Runtime], extra_env: dict[str, str] | None = None,
                     **kw: Any) -> tuple[Any, Runtime]:
    session = proxy.create_session()
    rt = rt_cls(endpoint=ProxyEndpoint.from_session(session),
                env={"TRACEWIRE_MODEL": MODEL_NAME, **(extra_env or {})}, **kw)
    async with rt:
        await rt.put_files({"agent.py": agent_file("chat_agent.py")})
        res = await rt.exec([VENV_PYTHON, "agent.py", str(TURNS)], timeout=120)
        assert res.ok, res.to_info()
        out = json.loads(res.stdout.decode().strip().splitlines()[-1])
        assert out["answers"] == [f"number {i} of {TURNS}" for i in range(TURNS)]
    return session.trace, rt


async def test_agent_in_bwrap_records_the_same_tokens_as_local(proxy: Proxy) -> None:
    phases: list[str] = []
    local, _ = await _run_agent(proxy, LocalRuntime)
    # CA-bundle variables as this host exports them: valid inside (the sandbox's /etc has
    # the certificates) or dropped (one pointing at a file the sandbox cannot see).
    ca = {"SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt",
          "REQUESTS_CA_BUNDLE": "/root/not-in-the-sandbox/ca.pem"}
    boxed, rt = await _run_agent(proxy, BwrapRuntime, ro_paths=[VENV], extra_env=ca,
                                 on_phase=lambda name, t0, t1: phases.append(name))
    assert isinstance(rt, BwrapRuntime)
    assert phases == ["boot", "exec", "close"]
    for tr in (local, boxed):
        assert len(tr.calls) == TURNS
        assert all(c.error is None for c in tr.calls)
    a, b = local.branch(local.calls[-1].node), boxed.branch(boxed.calls[-1].node)
    assert len(a.ids) > 0
    assert a.ids.tolist() == b.ids.tolist()
    assert a.mask.tolist() == b.mask.tolist()
    np.testing.assert_array_equal(a.logprobs, b.logprobs)


@pytest.fixture
def planted(tmp_path: Path) -> Any:
    """Secret files in the host's home, /tmp and a run directory."""
    tag = secrets.token_hex(4)
    home = Path.home() / f".tracewire-h8-secret-{tag}"
    host_tmp = Path(tempfile.gettempdir()) / f"tracewire-h8-secret-{tag}"
    run = tmp_path / "run" / "secret.txt"
    run.parent.mkdir()
    for p in (home, host_tmp, run):
        p.write_text("SECRET")
    yield {"home": home, "tmp": host_tmp, "run": run, "tag": tag}
    for p in (home, host_tmp):
        p.unlink(missing_ok=True)


async def test_agent_cannot_reach_anything_but_its_session(
        proxy: Proxy, model: Any, planted: dict[str, Any]) -> None:
    own, other = proxy.create_session(), proxy.create_session()
    ep = ProxyEndpoint.from_session(own)
    tag = planted["tag"]
    this_file = os.path.abspath(__file__)  # noqa: ASYNC240 - trivial
    model_port = int(model.base_url.rsplit(":", 1)[1].split("/")[0])
    sid, osid = own.id, other.id
    cfg = {
        "port": ep.port,
        "read": [str(planted["home"]), str(planted["tmp"]), str(planted["run"]), this_file,
                 "/etc/shadow"],
        "write": ["/usr/pwned", "/etc/pwned", "/pwned", "/run/tracewire/pwned",
                  os.path.join(VENV, "pwned"), str(planted["run"].parent / "pwned"),
                  str(Path.home() / f"pwned-{tag}"), f"/tmp/private-{tag}",
                  "/workspace/mine.txt"],
        "tcp": [["127.0.0.1", ep.port], ["127.0.0.1", model_port], ["127.0.0.1", 22],
                ["10.0.0.1", 80], ["8.8.8.8", 53]],
        "http": {
            "own_models": ["GET", f"/sessions/{sid}/v1/models", own.secret],
            "plain_models": ["GET", "/v1/models", own.secret],
            "probe": ["HEAD", f"/sessions/{sid}", own.secret],
            "session_summary": ["GET", f"/sessions/{sid}", own.secret],
            "create_session": ["POST", "/sessions", own.secret],
            "samples": ["POST", f"/sessions/{sid}/samples", own.secret],
            "other_session": ["GET", f"/sessions/{osid}/v1/models", other.secret],
            "other_secret": ["GET", "/v1/models", other.secret],
            "no_secret": ["GET", f"/sessions/{sid}/v1/models", ""],
            "dotdot": ["GET", f"/sessions/{sid}/v1/../../{osid}/v1/models", own.secret],
            "encoded": ["GET", f"/sessions/{sid}/v1/%2e%2e/%2e%2e/{osid}/v1/models",
                        own.secret],
            "viewer": ["GET", "/", own.secret],
        },
    }
    async with BwrapRuntime(endpoint=ep) as rt:
        await rt.put_files({"probe.py": agent_file("probe.py")})
        res = await rt.exec([PYTHON, "probe.py", json.dumps(cfg)], timeout=60)
        assert res.ok, res.to_info()
        out = json.loads(res.stdout)
        host_workdir = rt.host_workdir()
        assert (host_workdir / "mine.txt").read_text() == "pwned"

    assert [p for p, v in out["read"].items() if v.startswith("READ")] == [], out["read"]
    allowed = {f"/tmp/private-{tag}", "/workspace/mine.txt"}
    for path, verdict in out["write"].items():
        assert (verdict == "WROTE") == (path in allowed), (path, verdict)
    # The sandbox's /tmp was its own; the home it saw was not the host's.
    assert not Path(f"/tmp/private-{tag}").exists()  # noqa: ASYNC240 - a test check
    assert not (Path.home() / f"pwned-{tag}").exists()
    # Its own PID namespace: bwrap, the launcher, the probe; no host process.
    assert len(out["procs"]) <= 4, out["procs"]
    assert all("probe.py" in c for c in out["procs"]), out["procs"]
    tcp = out["tcp"]
    assert tcp[f"127.0.0.1:{ep.port}"] == "CONNECTED"
    assert [k for k, v in tcp.items() if v == "CONNECTED"] == [f"127.0.0.1:{ep.port}"]
    http = out["http"]
    assert http["own_models"] == 200 and http["plain_models"] == 200 and http["probe"] == 200
    for name in ("session_summary", "create_session", "samples", "other_session", "dotdot",
                 "encoded", "viewer"):
        assert http[name] == 403, (name, http)
    assert http["other_secret"] == 401 and http["no_secret"] == 401
    # The session API is really there on the host, so the 403s above are the relay's doing.
    async with aiohttp.ClientSession() as c, c.get(f"{proxy.url}/sessions/{sid}") as r:
        assert r.status in (200, 401)
    assert not host_workdir.exists()


def _needs_cgroup(rt: BwrapRuntime, which: str) -> None:
    cg = rt.cgroup
    if cg is None or which not in cg.counters():
        pytest.skip(f"no {which} cgroup can be made here; the rlimit fallback does not "
                    "bind root")


async def test_fork_bomb_is_stopped_by_the_process_limit() -> None:
    marker = "tw-forkbomb-" + secrets.token_hex(4)
    code = (f"# {marker}\nimport os, time\nfor _ in range(100000):\n"
            "    try:\n        os.fork()\n    except OSError:\n        time.sleep(0.5)\n"
            "        raise SystemExit(3)\n")
    async with BwrapRuntime(limits=Limits(processes=48)) as rt:
        _needs_cgroup(rt, "processes")
        assert rt.cgroup is not None
        cgroup_dirs = list(rt.cgroup.dirs.values())
        res = await rt.exec([PYTHON, "-c", code], timeout=60)
    assert [d for d in cgroup_dirs if d.exists()] == []
    assert not res.timed_out
    assert res.limit == "processes", res.to_info()
    assert isinstance(res.error(), ResourceLimitExceeded)
    assert procs_with(marker) == []


async def test_memory_hog_is_stopped_by_the_memory_limit() -> None:
    code = "chunks = []\nwhile True:\n    chunks.append(bytearray(16 << 20))\n"
    async with BwrapRuntime(limits=Limits(memory_bytes=128 << 20)) as rt:
        _needs_cgroup(rt, "memory")
        res = await rt.exec([PYTHON, "-c", code], timeout=60)
    assert not res.timed_out and res.exit_code != 0
    assert res.limit == "memory", res.to_info()
    err = res.error()
    assert isinstance(err, ResourceLimitExceeded) and err.limit == "memory"


async def test_timeout_keeps_output_and_leaves_nothing_behind() -> None:
    marker = "tw-timeout-" + secrets.token_hex(4)
    script = f"echo before; (sleep 300; : {marker}) & sleep 300 # {marker}"
    async with BwrapRuntime() as rt:
        state = rt.host_workdir().parent
        res = await rt.exec(["/bin/sh", "-c", script], timeout=1.5)
        assert res.timed_out and res.stdout == b"before\n"
        assert res.error() is not None
        assert procs_with(marker) == []
    assert not state.exists()


async def test_cancelled_exec_leaves_nothing_behind() -> None:
    marker = "tw-cancel-" + secrets.token_hex(4)
    script = f"echo started; sleep 300 # {marker}"
    rt = BwrapRuntime()
    state: Path | None = None

    async def rollout() -> None:
        nonlocal state
        async with rt:
            state = rt.host_workdir().parent
            await rt.exec(["/bin/sh", "-c", script], timeout=120)

    task = asyncio.create_task(rollout())
    for _ in range(600):
        await asyncio.sleep(0.05)
        if rt.last_result is not None and rt.last_result.stdout:
            break
    assert procs_with(marker), "the command never started"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert rt.last_result is not None and rt.last_result.cancelled
    assert rt.last_result.stdout == b"started\n"
    assert procs_with(marker) == []
    assert state is not None and not state.exists()  # noqa: ASYNC240
    await rt.close()  # idempotent


async def test_ca_variables_the_sandbox_cannot_honour_are_dropped() -> None:
    env = {"SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt",
           "REQUESTS_CA_BUNDLE": "/root/elsewhere/ca.pem", "CURL_CA_BUNDLE": "/tmp/x.pem"}
    async with BwrapRuntime(env=env) as rt:
        res = await rt.exec(["/bin/sh", "-c", 'echo "$SSL_CERT_FILE|$REQUESTS_CA_BUNDLE|'
                             '$CURL_CA_BUNDLE"; test -s "$SSL_CERT_FILE"'], timeout=30)
    assert res.ok, res.to_info()
    # /tmp inside is the sandbox's own, so a path there is kept (it names that /tmp).
    assert res.stdout == b"/etc/ssl/certs/ca-certificates.crt||/tmp/x.pem\n"
