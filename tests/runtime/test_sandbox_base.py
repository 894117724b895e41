"""What bwrap and docker share (``_sandbox.SandboxRuntime``), checked without booting either:
this also covers the docker runtime's command line on machines without a docker daemon
(its end-to-end tests, tests/runtime/test_docker.py, skip there)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tracewire.runtime import BwrapRuntime, DockerRuntime, Limits, ProxyEndpoint, SandboxError

EP = ProxyEndpoint("10.1.2.3", 8123, "sid", "sec")
LAUNCHER = ["-I", "-S", "/run/tracewire/launch.py", "8123", "/run/tracewire/proxy.sock", "--"]


@pytest.mark.parametrize("make", [lambda: BwrapRuntime(endpoint=EP),
                                  lambda: DockerRuntime("img", endpoint=EP)])
def test_both_sandboxes_address_the_session_on_their_own_loopback(make: object) -> None:
    rt = make()  # type: ignore[operator]
    assert rt.workdir == "/workspace" and rt.relay is None
    assert rt.agent_endpoint == ProxyEndpoint("127.0.0.1", 8123, "sid", "sec")
    assert rt.agent_endpoint.base_url == "http://127.0.0.1:8123/sessions/sid/v1"
    with pytest.raises(SandboxError, match=f"^{rt.name} runtime not booted$"):
        rt.host_workdir()
    assert rt.launcher_args() == LAUNCHER
    assert [rt.inside(None), rt.inside("sub/dir"), rt.inside("/abs")] == [
        "/workspace/", "/workspace/sub/dir", "/abs"]


def test_without_an_endpoint_the_launcher_listens_on_no_port() -> None:
    for rt in (BwrapRuntime(), DockerRuntime("img")):
        assert rt.agent_endpoint is None
        assert rt.launcher_args()[3] == "0"


def test_docker_command_lines(tmp_path: Path) -> None:
    # Booting needs a daemon; the state directory boot would make is set by hand here.
    rt = DockerRuntime("img:1", endpoint=EP, ro_paths=["/opt"], run_args=["--init"],
                       limits=Limits(disk_bytes=5 << 20, processes=64))
    rt._state = tmp_path
    rt.container = "tracewire-test"
    assert rt.host_workdir() == tmp_path / "work"
    argv = rt.run_argv()
    assert argv[argv.index("--network") + 1] == "none"
    assert f"{tmp_path / 'work'}:/workspace" in argv
    assert f"{tmp_path / 'run'}:/run/tracewire:ro" in argv
    assert argv[argv.index("--pids-limit") + 1] == "64"
    assert f"/tmp:rw,exec,size={5 << 20}" in argv and "/opt:/opt:ro" in argv
    # The image's python runs the launcher as the container's main process.
    assert argv[argv.index("--entrypoint") + 1] == "python3"
    assert argv[-len(LAUNCHER) - 2:] == ["--init", "img:1", *LAUNCHER]


def test_bwrap_command_line(tmp_path: Path) -> None:
    rt = BwrapRuntime(endpoint=EP)
    rt._state = tmp_path
    assert rt.host_workdir() == tmp_path / "rw" / "work"
    argv = rt.sandbox_argv(["agent", "--flag"], "sub")
    assert argv[argv.index("--chdir") + 1] == "/workspace/sub"
    i = argv.index(str(tmp_path / "rw" / "work"))
    assert argv[i - 1: i + 2] == ["--bind", str(tmp_path / "rw" / "work"), "/workspace"]
    # The running interpreter (bound at its own path) runs the launcher, then the agent.
    assert argv[-len(LAUNCHER) - 3:] == [os.path.realpath(sys.executable), *LAUNCHER, "agent",
                                         "--flag"]
