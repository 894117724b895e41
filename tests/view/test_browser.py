"""The viewer in a real headless Chromium: index, filters, episode, branches, tokens, live."""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest
from playwright.sync_api import expect

from tracewire.store import Run
from tracewire.trace import Episode, Message, Trace
from tracewire.view import ViewServer

from .builders import _turn, make_fixture_run

pytestmark = pytest.mark.browser
T = TypeVar("T")
BIG = 1_000_000


@pytest.fixture(scope="module")
def fixture_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Episode]]:
    path = tmp_path_factory.mktemp("view") / "run"
    return path, make_fixture_run(path, big=BIG)


@pytest.fixture(scope="module")
def server(fixture_run: tuple[Path, dict[str, Episode]]) -> Iterator[ViewServer]:
    with ViewServer.run_in_thread(fixture_run[0]) as srv:
        yield srv


def rows(page: Any) -> Any:
    return page.get_by_test_id("episode-row")


def test_index_sort_filter_and_open_episode(view_page: Any, server: ViewServer,
                                            fixture_run: tuple[Path, dict[str, Episode]]) -> None:
    page = view_page
    eps = fixture_run[1]
    page.goto(server.url + "/")
    expect(page.get_by_test_id("page-info")).to_have_text(f"1–{len(eps)} of {len(eps)}")
    expect(rows(page)).to_have_count(len(eps))
    expect(page.locator("[data-testid=reward-hist] rect")).to_have_count(20)

    # Sort by reward (descending first), then ascending.
    page.get_by_test_id("col-reward").click()
    expect(page.get_by_test_id("col-reward")).to_have_class(re.compile("sorted-desc"))
    best = max(eps.values(), key=lambda e: (e.reward, -list(eps).index(e.id)))
    expect(rows(page).first).to_have_attribute("data-id", best.id)
    page.get_by_test_id("col-reward").click()
    expect(page.get_by_test_id("col-reward")).to_have_class(re.compile("sorted-asc"))
    worst = min(eps.values(), key=lambda e: (e.reward, list(eps).index(e.id)))
    expect(rows(page).first).to_have_attribute("data-id", worst.id)

    # Filter: env, then a task-key search on top.
    page.get_by_test_id("filter-env").select_option("tools")
    tools = [e for e in eps.values() if e.env == "tools"]
    expect(rows(page)).to_have_count(len(tools))
    page.get_by_test_id("filter-q").fill("task-01")
    page.get_by_test_id("apply").click()
    want = [e for e in tools if e.task_key.startswith("task-01")]
    expect(rows(page)).to_have_count(len(want))
    expect(page.get_by_test_id("page-info")).to_have_text(f"1–{len(want)} of {len(want)}")

    # Open the first episode: chat bubbles with the tool call and its result.
    target = rows(page).first.get_attribute("data-id")
    rows(page).first.click()
    expect(page.get_by_test_id("episode-id")).to_have_text(target)
    bubbles = page.get_by_test_id("bubble")
    expect(bubbles).to_have_count(5)
    roles = [bubbles.nth(i).get_attribute("data-role") for i in range(5)]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    expect(page.get_by_test_id("tool-call")).to_contain_text('"a"')
    expect(page.get_by_test_id("stop")).to_have_text(eps[target].traces[0].stop or "")
    page.get_by_test_id("tab-timing").click()
    expect(page.get_by_test_id("waterfall")).to_be_visible()
    assert page.errors == []


def test_switch_branches(view_page: Any, server: ViewServer,
                         fixture_run: tuple[Path, dict[str, Episode]]) -> None:
    page = view_page
    ep = next(e for e in fixture_run[1].values() if e.task_key == "branchy")
    page.goto(f"{server.url}/#/episodes/{ep.id}")
    sel = page.get_by_test_id("branch-select")
    expect(sel.locator("option")).to_have_count(2)
    # Default branch: the last leaf (right branch).
    expect(page.get_by_test_id("conversation")).to_contain_text("right branch")
    expect(page.get_by_test_id("conversation")).not_to_contain_text("left branch")
    sel.select_option("4")
    expect(page.get_by_test_id("conversation")).to_contain_text("left branch")
    expect(page.get_by_test_id("conversation")).not_to_contain_text("right branch")
    expect(page.get_by_test_id("bubble")).to_have_count(len(ep.traces[0].path(4)))
    assert page.errors == []


def test_token_view_of_a_million_tokens(view_page: Any, server: ViewServer,
                                        fixture_run: tuple[Path, dict[str, Episode]]) -> None:
    page = view_page
    ep = next(e for e in fixture_run[1].values() if e.task_key == "million")
    total = len(ep.traces[0].columns)
    page.goto(f"{server.url}/#/episodes/{ep.id}")
    page.get_by_test_id("tab-tokens").click()
    expect(page.get_by_test_id("token-count")).to_have_text(f"{total:,} tokens")
    first = page.locator(".tok[data-pos='5']")
    expect(first).to_have_attribute("data-id", "1")  # ids: 4 prompt tokens, then pos - 4
    # Virtualized: only a screenful of cells exists, not a million.
    assert page.locator(".tok").count() < 3000
    # Jump near the end; the window there is fetched and drawn.
    page.get_by_test_id("token-jump").fill(str(total - 10))
    page.get_by_test_id("token-jump").press("Enter")
    cell = page.locator(f".tok[data-pos='{total - 10}']")
    expect(cell).to_have_attribute("data-id", str((total - 14) % 50_000))
    expect(cell).to_have_attribute("data-mask", "1")
    cell.hover()
    lp = float(ep.traces[0].columns.logprobs[total - 10])
    expect(page.get_by_test_id("token-info")).to_contain_text(
        f"pos {total - 10} · id {(total - 14) % 50_000} · logprob {lp:.4f}")
    expect(page.get_by_test_id("token-info")).to_contain_text("trained")
    assert page.locator(".tok").count() < 3000
    # The prompt tokens are shown as not trained.
    page.get_by_test_id("token-jump").fill("0")
    page.get_by_test_id("token-jump").press("Enter")
    expect(page.locator(".tok[data-pos='0']")).to_have_attribute("data-mask", "0")
    assert page.errors == []


class Writer:
    """A real store writer on its own event loop thread, driven step by step by the test."""

    def __init__(self, path: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.path = path
        self.rng = np.random.default_rng(3)

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)

    async def start(self) -> None:
        self.run = await Run.create(self.path, meta={"name": "live-run"}, fsync="never")
        self.ep = Episode(env="live", task_key="live-task")
        self.trace: Trace = self.ep.new_trace()
        self.journal = self.run.journal(self.ep)
        self.leaf: int | None = self.trace.add_node(Message(role="system", content="live!"),
                                                    ids=[1])
        self.trace.notify()

    async def turn(self, k: int) -> None:
        self.leaf = _turn(self.trace, self.leaf, f"live turn {k}", self.rng)
        self.trace.notify()

    async def finish(self) -> None:
        self.trace.stop = "done"
        self.trace.set_reward("r", 1.0)
        self.trace.notify()
        await self.run.append(self.ep)
        self.journal.close()
        await self.run.close()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


def test_live_episode_grows(view_page: Any, tmp_path: Path) -> None:
    page = view_page
    writer = Writer(tmp_path / "live")
    try:
        writer.call(writer.start())
        writer.call(writer.turn(0))
        with ViewServer.run_in_thread(tmp_path / "live", poll_interval=0.1) as srv:
            page.goto(srv.url + "/")
            live = page.get_by_test_id("live-row")
            expect(live).to_have_count(1)
            expect(live).to_have_attribute("data-id", writer.ep.id)
            live.click()
            expect(page.get_by_test_id("live-badge")).to_be_visible()
            bubbles = page.get_by_test_id("bubble")
            expect(bubbles).to_have_count(3)
            for k in range(1, 4):
                writer.call(writer.turn(k))
                expect(bubbles).to_have_count(1 + 2 * (k + 1))
                expect(bubbles.last).to_contain_text(f"answer to live turn {k}")
            expect(page.get_by_test_id("trace-calls")).to_have_text("4")
            writer.call(writer.finish())
            expect(page.get_by_test_id("live-badge")).to_have_count(0)
            expect(page.get_by_test_id("stop")).to_have_text("done")
            expect(bubbles).to_have_count(9)
            # Back on the index, the finished episode is a row and nothing runs.
            page.goto(srv.url + "/")
            expect(rows(page)).to_have_count(1)
            expect(page.get_by_test_id("live-row")).to_have_count(0)
        assert page.errors == []
    finally:
        writer.stop()
