"""The local runtime and the parts every runtime shares: files in and out, output kept on
a timeout, cleanup on every path."""

from __future__ import annotations

import asyncio
import os
import secrets
from pathlib import Path
from types import SimpleNamespace

import pytest

from tracewire import EnvError, LimitError, PhaseTimeout
from tracewire.runtime import ExecTimeout, LocalRuntime, ProxyEndpoint, SandboxError

from .conftest import procs_with


async def test_exec_env_files_and_cleanup() -> None:
    ep = ProxyEndpoint("127.0.0.1", 4321, "sid1", "tw-secret")
    phases: list[str] = []
    rt = LocalRuntime(endpoint=ep, env={"A": "1"},
                      on_phase=lambda name, t0, t1: phases.append(name))
    async with rt:
        work = rt.host_workdir()
        await rt.put_files({"in/task.json": '{"x": 1}', "b.bin": b"\0\1"})
        res = await rt.exec(
            ["/bin/sh", "-c", 'cat in/task.json; echo "$OPENAI_BASE_URL $A $B" >&2; '
             'cat; echo out > out.txt; exit 3'], env={"B": "2"}, stdin="piped")
        assert res.exit_code == 3 and not res.ok
        assert res.stdout == b'{"x": 1}piped'
        assert res.stderr == b"http://127.0.0.1:4321/sessions/sid1/v1 1 2\n"
        err = res.error()
        assert isinstance(err, SandboxError) and isinstance(err, EnvError)
        assert "exit code 3" in str(err)
        got = await rt.get_files(["out.txt", "b.bin", "missing.txt"])
        assert got == {"out.txt": b"out\n", "b.bin": b"\0\1"}
    assert not work.exists()
    assert phases == ["boot", "exec", "close"]
    await rt.close()
    with pytest.raises(SandboxError):
        await rt.exec(["true"])


async def test_the_agent_is_told_the_session_id_as_the_endpoint_names_it() -> None:
    ep = ProxyEndpoint("127.0.0.1", 4321, "sid1", "tw-secret")
    async with LocalRuntime(endpoint=ep) as rt:
        res = await rt.exec(["/bin/sh", "-c", 'printf "%s" "$TRACEWIRE_SESSION"'])
    assert res.stdout == b"sid1"


def test_endpoint_session_id_is_a_deprecated_name_of_id() -> None:
    # One name per thing: ``id`` as on proxy.Session and sessions.SessionInfo.
    ep = ProxyEndpoint.from_session(SimpleNamespace(
        base_url="http://10.0.0.2:8123/sessions/s-7/v1", id="s-7", secret="k"))
    assert (ep.host, ep.port, ep.id, ep.secret) == ("10.0.0.2", 8123, "s-7", "k")
    assert ep.on_loopback().id == "s-7"
    with pytest.warns(DeprecationWarning, match=r"ProxyEndpoint\.session_id is now "
                                                  r"ProxyEndpoint\.id"):
        assert ep.session_id == "s-7"


async def test_file_paths_stay_inside_the_workdir(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("SECRET")
    async with LocalRuntime(max_file_bytes=100) as rt:
        for bad in ("/etc/passwd", "../x", "a/../../x", ""):
            with pytest.raises(SandboxError):
                await rt.put_files({bad: "x"})
            with pytest.raises(SandboxError):
                await rt.get_files([bad])
        # Links planted by the agent are never followed, neither for reading nor writing.
        os.symlink(secret, rt.host_workdir() / "link.txt")
        os.symlink(tmp_path, rt.host_workdir() / "linkdir")
        with pytest.raises(SandboxError):
            await rt.get_files(["link.txt"])
        with pytest.raises(SandboxError):
            await rt.get_files(["linkdir/secret.txt"])
        with pytest.raises(SandboxError):
            await rt.put_files({"linkdir/new.txt": "x"})
        with pytest.raises(SandboxError):
            await rt.put_files({"link.txt": "x"})
        assert secret.read_text() == "SECRET" and not (tmp_path / "new.txt").exists()
        with pytest.raises(LimitError):
            await rt.put_files({"big": b"x" * 101})
        (rt.host_workdir() / "big").write_bytes(b"x" * 101)
        with pytest.raises(LimitError):
            await rt.get_files(["big"])


async def test_timeout_keeps_partial_output_and_kills_the_group() -> None:
    marker = "tw-local-" + secrets.token_hex(4)
    async with LocalRuntime() as rt:
        res = await rt.exec(
            ["/bin/sh", "-c", f"echo before; echo err >&2; (sleep 300; : {marker}) & "
             f"sleep 300 # {marker}"], timeout=1.0)
    assert res.timed_out and res.stdout == b"before\n" and res.stderr == b"err\n"
    err = res.error()
    assert isinstance(err, ExecTimeout) and isinstance(err, PhaseTimeout)
    assert err.result is res
    assert res.to_info()["stdout"] == "before\n"
    assert procs_with(marker) == []


async def test_cancel_kills_and_cleans_up() -> None:
    marker = "tw-local-cancel-" + secrets.token_hex(4)
    rt = LocalRuntime()
    await rt.boot()
    work = rt.host_workdir()
    task = asyncio.create_task(rt.exec(["/bin/sh", "-c", f"echo go; sleep 300 # {marker}"]))
    for _ in range(400):
        await asyncio.sleep(0.05)
        if rt.last_result is not None and rt.last_result.stdout:
            break
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert rt.last_result is not None and rt.last_result.cancelled
    assert rt.last_result.stdout == b"go\n"
    assert procs_with(marker) == []
    await rt.close()
    assert not work.exists()


async def test_missing_program_is_a_typed_error() -> None:
    async with LocalRuntime() as rt:
        with pytest.raises(SandboxError, match="cannot start"):
            await rt.exec(["/nonexistent/agent"])
        with pytest.raises(SandboxError):
            await rt.exec([])


async def test_process_hook_prefix_and_no_lookup() -> None:
    # What a CommandHarness without a runtime relies on: the pid and the exit status as
    # they happen, its own temp dir name, and the start's own error without a lookup.
    events: list[tuple[str, int]] = []
    rt = LocalRuntime(workdir_prefix="tw-test-", check_program=False,
                      on_process=lambda event, value: events.append((event, value)))
    async with rt:
        assert rt.host_workdir().name.startswith("tw-test-")
        res = await rt.exec(["/bin/sh", "-c", "exit 4"])
        assert events == [("spawn", res.extra["pid"]), ("exit", 4)]
        with pytest.raises(SandboxError, match=r"cannot start '/nonexistent/agent': \[Errno 2\]"):
            await rt.exec(["/nonexistent/agent"])
        events.clear()
        task = asyncio.ensure_future(rt.exec(["/bin/sh", "-c", "sleep 60"]))
        while not events:
            await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert [e for e, _ in events] == ["spawn"]  # killed: no exit of its own
