"""The docker/podman runtime, where a daemon and a local image exist (set
``TRACEWIRE_DOCKER_IMAGE``; nothing is pulled). Skipped otherwise, with the reason (the
reaping of dead harnesses' containers is also checked without a daemon, against a
stand-in, in ``test_docker_reap.py``)."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
from pathlib import Path
from typing import Any

import pytest

from tracewire.model import MODEL_NAME
from tracewire.proxy import Proxy
from tracewire.runtime import DockerRuntime, Limits, ProxyEndpoint, docker_usable

from .conftest import agent_file, procs_with
from .test_docker_reap import end, janitors_of, start_harness, wait_for
from .test_token import _endpoint, token_proxy  # noqa: F401  (a fixture, used by name)

ENGINE = os.environ.get("TRACEWIRE_DOCKER_ENGINE", "docker")
IMAGE = os.environ.get("TRACEWIRE_DOCKER_IMAGE", "tracewire-sandbox:local")
REASON = asyncio.run(docker_usable(ENGINE, IMAGE))
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"docker runtime: {REASON}")


async def test_probe_in_container_reaches_only_its_session(proxy: Proxy) -> None:
    own, other = proxy.create_session(), proxy.create_session()
    ep = ProxyEndpoint.from_session(own)
    cfg = {"port": ep.port, "read": [], "write": ["/usr/pwned", "/workspace/mine.txt"],
           "tcp": [["127.0.0.1", ep.port], ["8.8.8.8", 53]],
           "http": {"own": ["GET", f"/sessions/{own.id}/v1/models", own.secret],
                    "other": ["GET", f"/sessions/{other.id}/v1/models", other.secret],
                    "api": ["POST", "/sessions", own.secret]}}
    async with DockerRuntime(IMAGE, engine=ENGINE, endpoint=ep,
                             env={"TRACEWIRE_MODEL": MODEL_NAME}) as rt:
        await rt.put_files({"probe.py": agent_file("probe.py")})
        res = await rt.exec(["python3", "probe.py", json.dumps(cfg)], timeout=60)
        assert res.ok, res.to_info()
        out = json.loads(res.stdout)
    assert out["write"]["/usr/pwned"] != "WROTE"
    assert out["write"]["/workspace/mine.txt"] == "WROTE"
    assert out["tcp"][f"127.0.0.1:{ep.port}"] == "CONNECTED"
    assert out["tcp"]["8.8.8.8:53"] != "CONNECTED"
    assert out["http"] == {"own": 200, "other": 403, "api": 403}


async def test_timeout_and_limits_in_container() -> None:
    marker = "tw-docker-" + secrets.token_hex(4)
    async with DockerRuntime(IMAGE, engine=ENGINE, limits=Limits(processes=32)) as rt:
        res = await rt.exec(["/bin/sh", "-c", f"echo before; sleep 300 # {marker}"],
                            timeout=2)
        assert res.timed_out and res.stdout == b"before\n"
        name = rt.container
    proc = await asyncio.create_subprocess_exec(
        ENGINE, "ps", "-a", "-q", "--filter", f"name={name}",
        stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    assert out.strip() == b""  # the container is gone


async def _containers(*filters: str) -> list[str]:
    args = [a for f in filters for a in ("--filter", f)]
    proc = await asyncio.create_subprocess_exec(ENGINE, "ps", "-a", "-q", *args,
                                                stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    return out.decode().split()


async def test_sigkilled_harness_leaves_no_container_after_the_next_start() -> None:
    marker = "tw-dreal-" + secrets.token_hex(4)
    proc, where = await asyncio.to_thread(start_harness, IMAGE, ENGINE, marker)
    try:
        assert await wait_for(lambda: procs_with(marker)), "its command never started"
        state = Path(where["state"])
        assert await _containers(f"name={where['container']}",
                                 f"label=tracewire.state={state}")
        # Its janitor is killed first, so only the next start can clean up.
        for j in janitors_of(proc.pid):
            os.kill(j, signal.SIGKILL)
        proc.kill()
        await asyncio.to_thread(proc.wait)
        assert await _containers(f"name={where['container']}")  # still there
        async with DockerRuntime(IMAGE, engine=ENGINE):  # the next start
            pass
        assert await _containers(f"name={where['container']}") == []
        assert not state.exists()  # noqa: ASYNC240
        assert await wait_for(lambda: not procs_with(marker))
    finally:
        end(proc)


async def test_a_docker_agent_finds_the_trainer_token_nowhere(token_proxy: dict[str, Any]  # noqa: F811
                                                              ) -> None:
    """The canary scan of ``test_token.py`` (a proxy's env and token file, a host argv,
    the harness's env, the runtime's env) run in a container: it finds nothing."""
    canary = token_proxy["canary"]
    rt = DockerRuntime(IMAGE, engine=ENGINE, endpoint=_endpoint(token_proxy["session"]),
                       env={"TRACEWIRE_SESSION_TOKEN": canary, "MY_COPY": f"x{canary}x"})
    async with rt:
        await rt.put_files({"scan.py": agent_file("token_scan.py")})
        res = await rt.exec(["python3", "scan.py", str(token_proxy["since"]), "/"],
                            stdin=canary.encode(), timeout=300)
    assert res.ok, res.to_info()
    out = json.loads(res.stdout.decode().strip().splitlines()[-1])
    assert out["found"] == [], out
    assert out["files"] > 0 and out["procs"] >= 2  # it did look (launcher + itself)


_FILL = """
import errno, json, os
n = 0
try:
    with open("/tmp/fill", "wb") as f:
        while n < 64 << 20:
            f.write(b"x" * (1 << 20)); f.flush(); n += 1 << 20
    err = None
except OSError as exc:
    err = exc.errno
st = os.statvfs("/tmp")
print(json.dumps({"written": n, "errno": err, "size": st.f_blocks * st.f_frsize}))
"""


async def test_disk_bytes_bounds_the_container_tmp() -> None:
    """Under docker, ``disk_bytes`` sizes ``/tmp`` (a tmpfs in the container); a writer
    past it gets ``ENOSPC`` (``/workspace`` is a host directory, not bounded)."""
    bound = 8 << 20
    async with DockerRuntime(IMAGE, engine=ENGINE, limits=Limits(disk_bytes=bound)) as rt:
        res = await rt.exec(["python3", "-c", _FILL], timeout=120)
    assert res.ok, res.to_info()
    out = json.loads(res.stdout.decode().strip().splitlines()[-1])
    assert out["errno"] == 28 and out["written"] <= bound, out  # ENOSPC
    assert 0 < out["size"] <= bound, out
