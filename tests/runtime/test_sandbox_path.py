"""An agent CLI installed outside ``/usr`` (as an npm prefix, nvm or ``~/.npm-global``
lay one out: a ``bin`` link into ``lib/node_modules/<pkg>``, a ``#!/usr/bin/env`` line
naming an interpreter that lives in yet another prefix) runs under real bwrap once its
directory is given with ``sandbox_path`` / ``tracewire eval --sandbox-path``; without it,
boot fails with one line naming what is missing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tracewire.runtime import AgentPreset, BwrapRuntime, ProxyEndpoint, SandboxError
from tracewire.store import open_run

from .conftest import needs_bwrap

pytestmark = needs_bwrap


@pytest.fixture
def installed() -> Iterator[dict[str, Path]]:
    """``fakecli`` under an npm-like prefix, its interpreter ``twnode`` under another, and a
    data directory for ``--ro-path``; outside /usr and outside /tmp (the sandbox has its
    own /tmp), in a directory the sandbox does not show by default."""
    root = Path(tempfile.mkdtemp(prefix="tw-prefix-", dir="/var/tmp"))
    try:
        interp = root / "node-v0"
        (interp / "bin").mkdir(parents=True)
        (interp / "lib").mkdir()
        (interp / "lib" / "runtime.txt").write_text("interpreter runtime\n")
        node = interp / "bin" / "twnode"
        # The interpreter needs a file of its own prefix: it fails unless that is bound.
        node.write_text('#!/bin/sh\nd=$(dirname "$0")\n'
                        'cat "$d/../lib/runtime.txt" >/dev/null || exit 9\nexec /bin/sh "$@"\n')
        npm = root / "npm-global"
        pkg = npm / "lib" / "node_modules" / "fakecli"
        (pkg / "bin").mkdir(parents=True)
        (pkg / "package.json").write_text('{"name": "fakecli"}\n')
        (pkg / "VERSION").write_text("1.2.3\n")
        cli = pkg / "bin" / "cli.sh"
        cli.write_text('#!/usr/bin/env twnode\nhere=$(dirname "$(readlink -f "$0")")\n'
                       'echo "fakecli $(cat "$here/../VERSION")"\n'
                       'if [ -n "$1" ]; then cat "$1"; fi\n')
        (npm / "bin").mkdir()
        os.symlink("../lib/node_modules/fakecli/bin/cli.sh", npm / "bin" / "fakecli")
        data = root / "data"
        data.mkdir()
        (data / "input.txt").write_text("data via ro-path\n")
        for f in (node, cli):
            f.chmod(0o755)
        yield {"root": root, "bin": npm / "bin", "interp": interp / "bin", "data": data}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _preset(arg: str = "") -> AgentPreset:
    return AgentPreset("fakecli", ("fakecli", *([arg] if arg else [])), executables=("fakecli",))


async def test_provide_binds_the_install_tree_and_interpreter(installed: dict[str, Path]
                                                              ) -> None:
    ep = ProxyEndpoint("127.0.0.1", 40999, "s0")
    async with BwrapRuntime(endpoint=ep, sandbox_path=[installed["bin"], installed["interp"]]
                            ) as rt:
        argv, env, _ = _preset().render(rt)
        res = await rt.exec(argv, env=env, timeout=60)
        assert res.ok, res.to_info()
        assert res.stdout == b"fakecli 1.2.3\n"
        # What it bound: the package tree and the interpreter's prefix, not the whole root.
        binds = set(rt.sandbox_argv(["true"]))
        assert str(installed["root"] / "npm-global" / "lib" / "node_modules" / "fakecli") in binds
        assert str(installed["root"] / "node-v0") in binds
        assert str(installed["root"]) not in binds
        outside = await rt.exec(["/bin/sh", "-c", f"ls {installed['data']}"], timeout=30)
        assert not outside.ok  # a directory nobody named is not there


async def test_without_the_sandbox_path_boot_fails_naming_the_program(
        installed: dict[str, Path]) -> None:
    async with BwrapRuntime(endpoint=ProxyEndpoint("127.0.0.1", 40999, "s0")) as rt:
        with pytest.raises(SandboxError) as err:
            _preset().render(rt)
    msg = str(err.value)
    assert "'fakecli'" in msg and "--sandbox-path" in msg and "\n" not in msg
    # The interpreter missing is named the same way.
    async with BwrapRuntime(endpoint=ProxyEndpoint("127.0.0.1", 40999, "s0"),
                            sandbox_path=[installed["bin"]]) as rt:
        with pytest.raises(SandboxError, match="'twnode'"):
            _preset().render(rt)


_ENV = '''
from tracewire.env import CommandHarness, Environment, Task
from tracewire.runtime import AgentPreset

def preset(task):
    return AgentPreset("fakecli", ("fakecli", {data!r}), executables=("fakecli",))

env = Environment("fakecli", tasks=[Task("t0", {{}})],
                  harness=CommandHarness.from_preset(preset, runtime="bwrap"))
'''


def _eval(tmp_path: Path, env_file: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tracewire", "eval", str(env_file), "-q",
                           "--out", str(tmp_path / "run"), *extra],
                          capture_output=True, text=True, timeout=300)


def test_eval_sandbox_path_and_ro_path(installed: dict[str, Path], tmp_path: Path) -> None:
    env_file = tmp_path / "fake_env.py"
    env_file.write_text(_ENV.format(data=str(installed["data"] / "input.txt")))
    done = _eval(tmp_path, env_file, "--runtime", "bwrap",
                 "--sandbox-path", str(installed["bin"]),
                 "--sandbox-path", str(installed["interp"]), "--ro-path", str(installed["data"]))
    run = open_run(tmp_path / "run")
    (ep,) = list(run)
    (trace,) = ep.traces
    info = trace.info["command"]
    assert trace.ok and info["exit_code"] == 0, (done.stderr[-2000:], trace.errors, info)
    assert info["stdout"] == "fakecli 1.2.3\ndata via ro-path\n"
    assert json.loads(json.dumps(run.meta["config"]))["runtime"] == "bwrap"


def test_eval_without_sandbox_path_records_a_one_line_boot_error(
        installed: dict[str, Path], tmp_path: Path) -> None:
    env_file = tmp_path / "fake_env.py"
    env_file.write_text(_ENV.format(data=str(installed["data"] / "input.txt")))
    _eval(tmp_path, env_file, "--runtime", "bwrap")
    (ep,) = list(open_run(tmp_path / "run"))
    (trace,) = ep.traces
    assert trace.stop == "boot_error"
    (err,) = trace.errors
    assert "cannot run 'fakecli' in the sandbox" in err.message and "\n" not in err.message


def test_paths_without_a_sandbox_are_refused(installed: dict[str, Path], tmp_path: Path
                                             ) -> None:
    env_file = tmp_path / "fake_env.py"
    env_file.write_text(_ENV.format(data="x"))
    out = _eval(tmp_path, env_file, "--runtime", "local", "--ro-path", str(installed["data"]))
    assert out.returncode == 1 and "apply to a sandbox" in out.stderr
