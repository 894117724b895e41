"""A run whose writer was killed (kill -9 of a real process) is shown as "needs repair",
not as episodes running forever; a live writer and a closed run are told apart from it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from playwright.sync_api import expect

from tracewire.store import Run
from tracewire.trace import Episode, Message
from tracewire.view import ViewServer

from .builders import write_run
from .test_api import get_json

# A writer that journals one episode of two turns, says so, then waits to be killed.
WRITER = textwrap.dedent("""
    import asyncio, sys, time
    from pathlib import Path
    from tracewire.store import Run
    from tracewire.trace import Episode, Message

    async def main(path):
        run = await Run.create(path, meta={"name": "doomed"}, fsync="always")
        ep = Episode(env="crash", task_key="crash-task")
        tr = ep.new_trace()
        run.journal(ep)
        u = tr.add_node(Message(role="user", content="before the crash"), ids=[1, 2])
        tr.add_node(Message(role="assistant", content="last words"), parent=u, sampled=True,
                    ids=[3, 4], logprobs=[-0.5, -0.25])
        tr.notify()
        journal = run.layout.journal(ep.id)
        for _ in range(500):  # until the writer thread has put the deltas on disk
            await asyncio.sleep(0.01)
            if journal.exists() and len(run.live()) == 0 and journal.stat().st_size > 0:
                break
        print(ep.id, flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main(Path(sys.argv[1])))
""")


def start_writer(path: Path) -> tuple[subprocess.Popen[str], str]:
    """Run the writer above in a real process until its journal is on disk; returns the
    process and the journaled episode's id."""
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None
    eid = proc.stdout.readline().strip()
    if not eid:
        kill(proc)
        raise AssertionError("the writer process did not start")
    return proc, eid


def kill(proc: subprocess.Popen[str]) -> None:
    """kill -9, as a crash or the OOM killer would."""
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    if proc.stdout is not None:
        proc.stdout.close()


def crashed_run(path: Path) -> str:
    """A run whose writer was SIGKILLed once its journal was on disk; the episode's id."""
    proc, eid = start_writer(path)
    kill(proc)
    return eid


@pytest.fixture
def crashed(tmp_path: Path) -> tuple[Path, str]:
    path = tmp_path / "run"
    return path, crashed_run(path)


async def events_first(s: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with s.get(url + "/api/events") as r:
        async for line in r.content:
            if line.startswith(b"data: "):
                return orjson.loads(line[6:])  # type: ignore[no-any-return]
    raise AssertionError("no event")


async def test_writer_killed_while_watched(tmp_path: Path) -> None:
    proc, eid = start_writer(tmp_path / "run")
    try:
        async with ViewServer(tmp_path / "run", poll_interval=0.05) as srv, \
                aiohttp.ClientSession() as s, s.get(srv.url + "/api/events") as r:
            states = []
            async for line in r.content:
                if not line.startswith(b"data: "):
                    continue
                event = orjson.loads(line[6:])
                assert [e["id"] for e in event["episodes"]] == [eid]
                states.append(event["health"]["state"])
                if states == ["live"]:
                    kill(proc)  # the stream must say so, not go on showing it as running
                if states[-1] == "needs_repair":
                    break
            assert states[0] == "live" and states[-1] == "needs_repair"
    finally:
        if proc.poll() is None:
            kill(proc)


async def test_crashed_run_needs_repair(crashed: tuple[Path, str]) -> None:
    path, eid = crashed
    with Run.open(path) as reader:
        report = reader.verify()
    kinds = {p.kind for p in report.problems}
    assert {"unrecovered journals", "not closed"} <= kinds  # what the viewer relays
    async with ViewServer(path, poll_interval=0.05) as srv, aiohttp.ClientSession() as s:
        info = await get_json(s, srv.url + "/api/run")
        health = info["health"]
        assert health["state"] == "needs_repair" and health["journals"] == 1
        assert health["hint"] == f"run `tracewire check --repair {path}`"
        ep = await get_json(s, f"{srv.url}/api/episodes/{eid}")
        assert ep["live"] is True and ep["stale"] is True
        assert ep["traces"][0]["n_nodes"] == 2  # what it wrote before dying is shown
        event = await events_first(s, srv.url)
        assert [e["id"] for e in event["episodes"]] == [eid]
        assert event["health"]["state"] == "needs_repair"
    # Once repaired, the journal is an incomplete episode and the run reads as closed.
    Run.repair(path)
    async with ViewServer(path) as srv, aiohttp.ClientSession() as s:
        info = await get_json(s, srv.url + "/api/run")
        assert info["health"]["state"] == "closed" and info["health"]["journals"] == 0
        page = await get_json(s, srv.url + "/api/episodes")
        assert [(r["id"], r["status"]) for r in page["rows"]] == [(eid, "incomplete")]
        ep = await get_json(s, f"{srv.url}/api/episodes/{eid}")
        assert ep["live"] is False and ep["stale"] is False


async def test_live_writer_and_closed_run_are_not_flagged(tmp_path: Path) -> None:
    run = await Run.create(tmp_path / "live", meta={"name": "alive"}, fsync="never")
    ep = Episode(env="e", task_key="t")
    tr = ep.new_trace()
    journal = run.journal(ep)
    tr.add_node(Message(role="user", content="hi"), ids=[1])
    tr.notify()
    try:
        async with ViewServer(tmp_path / "live") as srv, aiohttp.ClientSession() as s:
            info = await get_json(s, srv.url + "/api/run")
            assert info["health"]["state"] == "live"
    finally:
        journal.close()
        await run.close()
    await write_run(tmp_path / "closed", [ep])
    async with ViewServer(tmp_path / "closed") as srv, aiohttp.ClientSession() as s:
        info = await get_json(s, srv.url + "/api/run")
        assert info["health"] == {"state": "closed", "journals": 0, "status": "complete",
                                  "hint": None}


# Browser tests stay last in the module: the module-scoped Playwright browser keeps an
# event loop on this thread from its first use on, which async tests after it would trip on.
@pytest.mark.browser
def test_crashed_run_page_says_needs_repair(view_page: Any, crashed: tuple[Path, str]) -> None:
    path, eid = crashed
    page = view_page
    with ViewServer.run_in_thread(path, poll_interval=0.05) as srv:
        page.goto(srv.url + "/")
        expect(page.get_by_test_id("needs-repair")).to_contain_text(
            f"needs repair: run `tracewire check --repair {path}`")
        expect(page.get_by_role("heading", name="Left by a crashed writer (not running)")
               ).to_be_visible()
        row = page.get_by_test_id("live-row")
        expect(row).to_have_attribute("data-id", eid)
        expect(row.get_by_test_id("stale-badge")).to_have_text("stale")
        row.click()
        expect(page.get_by_test_id("stale-badge")).to_contain_text("tracewire check --repair")
        expect(page.get_by_test_id("live-badge")).to_have_count(0)
        expect(page.get_by_test_id("bubble").last).to_contain_text("last words")
    assert page.errors == []
