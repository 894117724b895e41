"""The trainer's session-API token is found nowhere a bwrap agent can read: a canary token
given to a real `tracewire proxy` through --session-token-file, also in that proxy's
environment, in a host process's argv and in the harness's own environment and runtime
env. The same scan run on the host (the `local` runtime) finds it, so the scan works."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tracewire.model import ModelServer
from tracewire.runtime import BwrapRuntime, LocalRuntime, ProxyEndpoint

from .conftest import PYTHON, agent_file, needs_bwrap


def _start(upstream: str, tfile: Path, canary: str
           ) -> tuple[subprocess.Popen[str], subprocess.Popen[bytes]]:
    env = {**os.environ, "TRACEWIRE_SESSION_TOKEN": canary}
    proxy = subprocess.Popen(
        [sys.executable, "-m", "tracewire", "proxy", "--upstream", upstream,
         "--session-token-file", str(tfile)], stdout=subprocess.PIPE, text=True, env=env)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", canary])
    return proxy, sleeper


@pytest.fixture
async def token_proxy(model: ModelServer, tmp_path: Path,
                      monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[dict[str, Any]]:
    """A `tracewire proxy` whose token comes from a 0600 file, a host process holding the
    token on its argv, and the token in this process's environment."""
    since = time.time() - 1
    canary = "twcanary" + secrets.token_hex(12)
    tfile = tmp_path / "token"
    tfile.write_text(canary + "\n")
    tfile.chmod(0o600)
    proxy, sleeper = await asyncio.to_thread(_start, model.base_url, tfile, canary)
    monkeypatch.setenv("TRACEWIRE_SESSION_TOKEN", canary)
    try:
        assert proxy.stdout is not None
        url = (await asyncio.to_thread(proxy.stdout.readline)).strip()
        assert url.startswith("http://127.0.0.1:"), url
        # The token from the file opens the session API (and nothing was printed for it).
        async with aiohttp.ClientSession() as c, c.post(url + "/sessions", json={},
                          headers={"Authorization": f"Bearer {canary}"}) as r:
            assert r.status == 201
            session = await r.json()
        yield {"canary": canary, "since": since, "session": session, "dir": tmp_path}
    finally:
        for p in (proxy, sleeper):
            p.terminate()
        await asyncio.to_thread(proxy.wait)
        await asyncio.to_thread(sleeper.wait)
        if proxy.stdout is not None:
            proxy.stdout.close()


def _endpoint(session: dict[str, Any]) -> ProxyEndpoint:
    class S:
        base_url = session["base_url"]
        id = session["session_id"]
        secret = session["api_key"]

    return ProxyEndpoint.from_session(S())


@needs_bwrap
async def test_a_bwrap_agent_finds_the_trainer_token_nowhere(token_proxy: dict[str, Any]
                                                            ) -> None:
    canary = token_proxy["canary"]
    # Passed by mistake in the runtime's env, by name and under another name: dropped.
    rt = BwrapRuntime(endpoint=_endpoint(token_proxy["session"]),
                      env={"TRACEWIRE_SESSION_TOKEN": canary, "MY_COPY": f"x{canary}x"})
    async with rt:
        await rt.put_files({"scan.py": agent_file("token_scan.py")})
        res = await rt.exec([PYTHON, "scan.py", str(token_proxy["since"]), "/"],
                            stdin=canary, timeout=300)
    assert res.ok, res.to_info()
    out = json.loads(res.stdout.decode().strip().splitlines()[-1])
    assert out["found"] == [], out
    assert out["files"] > 0 and out["procs"] >= 2  # it did look (launcher + itself)


async def test_on_the_host_the_same_scan_finds_it(token_proxy: dict[str, Any]) -> None:
    """What docs/RUNTIMES.md says of `local`: a host agent reads other processes' argv and
    environment of the same user, and files the user can read."""
    canary = token_proxy["canary"]
    async with LocalRuntime(endpoint=_endpoint(token_proxy["session"])) as rt:
        await rt.put_files({"scan.py": agent_file("token_scan.py")})
        res = await rt.exec([PYTHON, "scan.py", str(token_proxy["since"]),
                             str(token_proxy["dir"])], stdin=canary, timeout=120)
    assert res.ok, res.to_info()
    found = json.loads(res.stdout.decode().strip().splitlines()[-1])["found"]
    assert not [f for f in found if f.startswith("env:")]  # its own env is clean
    assert any(f.endswith("/environ") for f in found), found  # the proxy's environment
    assert any(f.endswith("/cmdline") for f in found), found  # the sleeper's argv
    assert str(token_proxy["dir"] / "token") in found


def test_a_token_file_readable_by_others_is_refused(tmp_path: Path) -> None:
    tfile = tmp_path / "token"
    tfile.write_text("tws-something-long-enough\n")
    tfile.chmod(0o644)
    out = subprocess.run([sys.executable, "-m", "tracewire", "proxy", "--upstream",
                          "http://127.0.0.1:9/v1", "--session-token-file", str(tfile)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "readable by group or others" in out.stderr
    both = subprocess.run([sys.executable, "-m", "tracewire", "proxy", "--upstream",
                           "http://127.0.0.1:9/v1", "--session-token", "x",
                           "--session-token-file", str(tfile)],
                          capture_output=True, text=True, timeout=120)
    assert both.returncode == 2 and "not allowed with" in both.stderr
