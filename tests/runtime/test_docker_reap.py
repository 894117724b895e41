"""Containers and state directories of dead docker-runtime harnesses are reaped at the next
start (or by the dead harness's janitor); live owners' are kept, and a reused pid does not
pass for the owner.

No docker daemon can run on the machines these tests run on, so ``docker`` here is a
stand-in (``fake_docker.py``, first on ``PATH``): it records every command line the
runtime sends and answers ``ps``/``inspect``/``rm``/``run``/``exec`` from a JSON file of
containers. The tests assert on those exact command lines and on which containers and
directories are left. Everything else is real: the harness processes, their SIGKILL, the
janitor, the owner locks and ``/proc``. The same reap runs against a real daemon in
``test_docker.py`` where one exists.
"""

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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tracewire.runtime import DockerRuntime
from tracewire.runtime._reap import Marker

from .conftest import procs_with

FAKE = Path(__file__).with_name("fake_docker.py")


@dataclass
class FakeDocker:
    """The stand-in's executable, its containers file, its log and a private TMPDIR."""

    exe: Path
    state: Path
    log: Path
    tmp: Path

    def containers(self) -> list[dict[str, Any]]:
        if not self.state.exists():
            return []
        return list(json.loads(self.state.read_text())["containers"])

    def seed(self, containers: list[dict[str, Any]]) -> None:
        self.state.write_text(json.dumps({"containers": containers}))

    def calls(self) -> list[list[str]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def env(self) -> dict[str, str]:
        return {**os.environ, "PATH": f"{self.exe.parent}{os.pathsep}{os.environ['PATH']}",
                "TMPDIR": str(self.tmp)}


def install_fake_docker(where: Path) -> FakeDocker:
    """Write ``where/bin/docker``: the stand-in, bound to files under ``where``."""
    (where / "bin").mkdir()
    (where / "tmp").mkdir()
    fake = FakeDocker(where / "bin" / "docker", where / "containers.json",
                      where / "calls.jsonl", where / "tmp")
    fake.exe.write_text(
        f"#!{sys.executable} -I\nimport os, runpy\n"
        f"os.environ['FAKE_DOCKER_STATE'] = {str(fake.state)!r}\n"
        f"os.environ['FAKE_DOCKER_LOG'] = {str(fake.log)!r}\n"
        f"runpy.run_path({str(FAKE)!r}, run_name='__main__')\n")
    fake.exe.chmod(0o755)
    return fake


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeDocker:
    fd = install_fake_docker(tmp_path)
    monkeypatch.setenv("PATH", fd.env()["PATH"])
    monkeypatch.setattr(tempfile, "tempdir", str(fd.tmp))
    return fd


# -- what the runtime should write, computed here from /proc independently -------------
def start_ticks(pid: int) -> int:
    """Field 22 of ``/proc/PID/stat``: when the process started."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2:].split()[19])


def pidns() -> str:
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    return f"{boot}:{os.readlink('/proc/self/ns/pid')[len('pid:['):-1]}"


def ps_call() -> list[str]:
    return ["ps", "-a", "-q", "--filter", "label=tracewire.owner", "--filter",
            f"label=tracewire.pidns={pidns()}"]


def container(owner: str | None, *, ns: str | None = None, state: str = "") -> dict[str, Any]:
    cid = secrets.token_hex(32)
    labels = {"tracewire.runtime": "1"}
    if owner is not None:
        labels |= {"tracewire.owner": owner, "tracewire.pidns": ns or pidns(),
                   "tracewire.state": state}
    return {"Id": cid, "Name": "tracewire-" + cid[:12], "Labels": labels, "Image": "img"}


@pytest.fixture
def owners() -> Iterator[dict[str, str]]:
    """Owner labels of a process that has exited and been waited for (``dead``), of one
    that has exited but is still a zombie (``zombie``) and of one that runs (``live``)."""
    procs = {k: subprocess.Popen(["sleep", "60"]) for k in ("dead", "zombie", "live")}
    labels = {k: f"{p.pid}:{start_ticks(p.pid)}" for k, p in procs.items()}
    procs["dead"].kill()
    procs["dead"].wait()
    procs["zombie"].kill()
    zombie = Path(f"/proc/{procs['zombie'].pid}/stat")
    while zombie.read_text().rsplit(")", 1)[1].split()[0] != "Z":
        time.sleep(0.01)
    try:
        yield labels
    finally:
        for p in procs.values():
            p.kill()
            p.wait()


async def test_boot_reaps_containers_of_dead_owners_and_keeps_the_rest(
        fake: FakeDocker, tmp_path: Path, owners: dict[str, str]) -> None:
    me = f"{os.getpid()}:{start_ticks(os.getpid())}"
    reused = f"{os.getpid()}:{start_ticks(os.getpid()) - 1}"  # this pid, another process
    # A dead harness ran with another TMPDIR: its directory is found by the label.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    unlocked = elsewhere / "tw-docker-dead"
    unlocked.mkdir()
    Marker(unlocked).release()  # an owner lock nobody holds: its owner died
    no_lock = elsewhere / "tw-docker-nolock"  # no owner lock: nobody vouches for it
    no_lock.mkdir()
    precious = tmp_path / "precious"  # not a directory this part makes
    precious.mkdir()
    gone = {
        "dead": container(owners["dead"], state=str(unlocked)),
        "zombie": container(owners["zombie"], state=str(no_lock)),
        "reused": container(reused, state=str(precious)),
    }
    kept = {
        "mine": container(me),
        "live": container(owners["live"]),
        "other-namespace": container(owners["dead"], ns="another-boot:4026531836"),
        "no-owner": container(None),
        "not-ours": container("someone"),
    }
    fake.seed([gone["dead"], kept["mine"], gone["zombie"], kept["live"], gone["reused"],
               kept["other-namespace"], kept["no-owner"], kept["not-ours"]])
    async with DockerRuntime("img") as rt:
        state = rt.host_workdir().parent
        name = rt.container
        during = {c["Name"] for c in fake.containers()}
    calls = fake.calls()
    listed = [gone["dead"], kept["mine"], gone["zombie"], kept["live"], gone["reused"],
              kept["not-ours"]]
    assert calls[0] == ps_call()
    assert calls[1] == ["inspect", *[c["Id"][:12] for c in listed]]
    assert calls[2] == ["rm", "-f", gone["dead"]["Id"], gone["zombie"]["Id"],
                        gone["reused"]["Id"]]
    assert calls[3][0] == "run" and calls[3][calls[3].index("--name") + 1] == name
    assert calls[4:] == [["rm", "-f", name]]
    assert during == {c["Name"] for c in kept.values()} | {name}
    assert [c["Id"] for c in fake.containers()] == [c["Id"] for c in kept.values()]
    assert not unlocked.exists() and no_lock.is_dir() and precious.is_dir()
    assert not state.exists()


async def test_a_boot_with_nothing_to_reap_asks_once_and_labels_its_container(
        fake: FakeDocker) -> None:
    async with DockerRuntime("img") as rt:
        state = rt.host_workdir().parent
        (c,) = fake.containers()
        assert state.parent == fake.tmp and state.name.startswith("tw-docker-")
        assert (state / "owner.lock").is_file()
    calls = fake.calls()
    assert calls[0] == ps_call()
    run = calls[1]
    labels = [run[i + 1] for i, a in enumerate(run) if a == "--label"]
    assert labels == ["tracewire.runtime=1",
                      f"tracewire.owner={os.getpid()}:{start_ticks(os.getpid())}",
                      f"tracewire.pidns={pidns()}", f"tracewire.state={state}"]
    assert c["Labels"] == dict(lb.split("=", 1) for lb in labels)
    assert calls[2:] == [["rm", "-f", rt.container]]
    assert fake.containers() == [] and not state.exists()


# A harness in its own process: boots a docker runtime, starts a long command in it,
# prints where everything is, then waits to be killed. Shared with test_docker.py.
HARNESS = """
import asyncio, json, sys
from tracewire.runtime import DockerRuntime

async def main():
    rt = DockerRuntime(sys.argv[1], engine=sys.argv[2])
    await rt.boot()
    task = asyncio.ensure_future(rt.exec(["/bin/sh", "-c", sys.argv[3]], timeout=600))
    print(json.dumps({"state": str(rt.host_workdir().parent), "container": rt.container}),
          flush=True)
    await task

asyncio.run(main())
"""


def start_harness(image: str, engine: str, marker: str, env: dict[str, str] | None = None
                  ) -> tuple[subprocess.Popen[str], dict[str, str]]:
    """The harness, once its command runs (its ``exec`` client is on the host)."""
    script = f"echo started; sleep 600 # {marker}"
    proc = subprocess.Popen([sys.executable, "-c", HARNESS, image, engine, script],
                            stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, "the harness did not boot its runtime"
    return proc, json.loads(line)


def janitors_of(pid: int) -> list[int]:
    """Pids of the janitors watching ``pid`` (``… _reap.py watch TMPDIR PID [ENGINE]``)."""
    found = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                parts = Path(f"/proc/{p}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
            except OSError:
                continue
            if b"watch" in parts:
                i = parts.index(b"watch")
                if parts[i + 2: i + 3] == [str(pid).encode()]:
                    found.append(int(p))
    return found


async def wait_for(check: Any, tries: int = 400) -> bool:
    for _ in range(tries):
        if check():
            return True
        await asyncio.sleep(0.05)
    return bool(check())


def exec_logged(fake: FakeDocker) -> bool:
    """Whether the stand-in has recorded the harness's ``exec`` (its client is running)."""
    return any(c[0] == "exec" for c in fake.calls())


def end(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


async def test_sigkilled_harness_leaves_nothing_after_the_next_start(fake: FakeDocker) -> None:
    marker = "tw-dreap-" + secrets.token_hex(4)
    proc, where = await asyncio.to_thread(start_harness, "img", str(fake.exe), marker,
                                          fake.env())
    try:
        assert await wait_for(lambda: procs_with(marker) and exec_logged(fake)), \
            "its command never started"
        (left,) = fake.containers()
        assert left["Name"] == where["container"]
        # Its janitor is killed first, so only the next start can clean up.
        janitors = janitors_of(proc.pid)
        assert janitors
        for j in janitors:
            os.kill(j, signal.SIGKILL)
        proc.kill()
        await asyncio.to_thread(proc.wait)
        assert Path(where["state"]).is_dir() and fake.containers() == [left]  # noqa: ASYNC240
        assert procs_with(marker)  # the exec client outlives its harness
        before = len(fake.calls())
        async with DockerRuntime("img") as rt:  # the next start
            assert [c["Name"] for c in fake.containers()] == [rt.container]
        assert fake.calls()[before:before + 3] == [
            ps_call(), ["inspect", left["Id"][:12]], ["rm", "-f", left["Id"]]]
        assert fake.containers() == []
        assert not Path(where["state"]).exists()  # noqa: ASYNC240
        assert await wait_for(lambda: not procs_with(marker))
    finally:
        end(proc)


async def test_sigkilled_harness_is_cleaned_by_its_janitor(fake: FakeDocker) -> None:
    marker = "tw-djan-" + secrets.token_hex(4)
    proc, where = await asyncio.to_thread(start_harness, "img", str(fake.exe), marker,
                                          fake.env())
    try:
        assert await wait_for(lambda: procs_with(marker) and exec_logged(fake)), \
            "its command never started"
        (left,) = fake.containers()
        assert janitors_of(proc.pid)
        proc.kill()
        await asyncio.to_thread(proc.wait)
        # No new start here: the harness's janitor notices it died and reaps.
        assert await wait_for(lambda: fake.containers() == []
                              and not Path(where["state"]).exists())
        assert ["rm", "-f", left["Id"]] in fake.calls()
        assert await wait_for(lambda: not procs_with(marker))
    finally:
        end(proc)


async def test_the_trainer_token_is_on_no_command_line_the_engine_gets(
        fake: FakeDocker, monkeypatch: pytest.MonkeyPatch) -> None:
    canary = "twcanary" + secrets.token_hex(12)
    monkeypatch.setenv("TRACEWIRE_SESSION_TOKEN", canary)
    async with DockerRuntime("img", env={"TRACEWIRE_SESSION_TOKEN": canary,
                                         "NOTE": f"token={canary}", "KEEP": "yes"}) as rt:
        res = await rt.exec(["/bin/true"], timeout=30)
        assert res.ok, res.to_info()
    (ex,) = [c for c in fake.calls() if c[0] == "exec"]
    assert "KEEP=yes" in ex and ex[-2:] == [rt.container, "/bin/true"]
    assert not [c for c in fake.calls() if any(canary in a for a in c)]


def test_without_a_readable_proc_nothing_is_judged(fake: FakeDocker, owners: dict[str, str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Where ``/proc`` cannot be read every owner would look gone: nothing is asked or
    removed (the namespace lookup is replaced by its failure value here)."""
    from tracewire.runtime import _reap

    c = container(owners["dead"], ns="unknown")
    fake.seed([c])
    with monkeypatch.context() as m:
        m.setattr(_reap, "_pidns", lambda: "unknown")
        assert _reap.reap_containers(str(fake.exe)) == []
    assert fake.calls() == [] and fake.containers() == [c]
    fake.seed([container(owners["dead"])])
    assert len(_reap.reap_containers(str(fake.exe))) == 1  # the same, judged, goes
    assert fake.containers() == []
