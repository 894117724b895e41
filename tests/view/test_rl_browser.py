"""The RL views in a real headless Chromium: group page (rewards, advantages, keys), diff page
(the first differing token), heat colours, run against run, and live updates."""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import orjson
import pytest
from playwright.sync_api import expect

from tracewire.store import Run, open_run
from tracewire.tito import ChatTokenizer
from tracewire.tito.fixtures import build_tokenizer_dir
from tracewire.trace import Episode
from tracewire.view import ViewServer

from .builders import write_run
from .rl_builders import (
    PROMPT_IDS,
    diff_pair,
    expected_compare,
    expected_groups,
    in_thread,
    make_eval_runs,
    make_train_run,
    rollout,
    write_pairs,
)
from .test_rl_api import chatml_episode
from .test_steps import stepped

pytestmark = pytest.mark.browser
T = TypeVar("T")


@pytest.fixture(scope="module")
def train_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_train_run(tmp_path_factory.mktemp("btrain") / "train")


@pytest.fixture(scope="module")
def eval_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("beval")
    return make_eval_runs(base / "eval-a", base / "eval-b")


def test_group_page_rewards_and_advantages(view_page: Any, train_run: Path) -> None:
    page = view_page
    want = expected_groups(train_run)
    mixed = [k for k, g in want.items() if len(set(g["reward"].values())) > 1]
    with ViewServer.run_in_thread(train_run) as srv:
        page.goto(srv.url + "/#/groups")
        rows = page.get_by_test_id("group-row")
        expect(rows).to_have_count(len(want))
        page.get_by_test_id("gfilter-spread").select_option("mixed")
        expect(rows).to_have_count(len(mixed))
        page.get_by_test_id("gfilter-spread").select_option("")
        expect(rows).to_have_count(len(want))
        # Keyboard: j moves the row cursor, Enter opens the group.
        page.keyboard.press("j")
        page.keyboard.press("Enter")
        first = rows.first
        expect(page.get_by_test_id("group-header")).to_be_visible()
        for step in range(len(want)):
            key = page.get_by_test_id("group-key").inner_text()
            g = want[key]
            roll = page.get_by_test_id("rollout-row")
            expect(roll).to_have_count(len(g["reward"]))
            shown = [float(roll.nth(i).get_by_test_id("rollout-reward").inner_text())
                     for i in range(roll.count())]
            assert shown == sorted(g["reward"].values(), reverse=True)
            for i in range(roll.count()):
                eid = str(roll.nth(i).get_attribute("data-id"))
                cell = roll.nth(i).get_by_test_id("rollout-advantage")
                assert float(str(cell.get_attribute("data-value"))) == pytest.approx(
                    g["advantage"][eid], abs=1e-9)
                assert float(roll.nth(i).get_by_test_id("rollout-part-correct").inner_text()) \
                    == g["parts"][eid]["correct"]
            if step + 1 < len(want):
                page.keyboard.press("n")
                expect(page.get_by_test_id("group-key")).not_to_have_text(key)
        page.keyboard.press("p")
        expect(page.get_by_test_id("group-prev")).to_be_enabled()
        assert first is not None
    assert page.errors == []


def test_keys_from_a_group_to_its_episodes_and_back(view_page: Any, train_run: Path) -> None:
    page = view_page
    key = next(iter(expected_groups(train_run)))
    with ViewServer.run_in_thread(train_run) as srv:
        page.goto(f"{srv.url}/#/groups/{key.replace('/', '%2F')}")
        roll = page.get_by_test_id("rollout-row")
        expect(roll).to_have_count(3)
        order = [str(roll.nth(i).get_attribute("data-id")) for i in range(3)]
        page.keyboard.press("j")
        page.keyboard.press("Enter")
        expect(page.get_by_test_id("episode-id")).to_have_text(order[0])
        page.keyboard.press("n")
        expect(page.get_by_test_id("episode-id")).to_have_text(order[1])
        page.keyboard.press("p")
        expect(page.get_by_test_id("episode-id")).to_have_text(order[0])
        page.keyboard.press("p")
        expect(page.get_by_test_id("episode-id")).to_have_text(order[2])  # wraps around
        page.keyboard.press("2")
        expect(page.get_by_test_id("token-view")).to_be_visible()
        page.keyboard.press("u")
        expect(page.get_by_test_id("group-key")).to_have_text(key)
        page.keyboard.press("?")
        expect(page.get_by_test_id("keys-help")).to_contain_text("next group")
        page.keyboard.press("g")
        expect(page.get_by_test_id("group-row")).to_have_count(len(expected_groups(train_run)))
    assert page.errors == []


def test_diff_page_points_at_the_first_differing_token(view_page: Any, tmp_path: Path) -> None:
    at_turn, at_token = 1, 7
    a, b = diff_pair(3, at_turn, at_token)
    in_thread(write_pairs(tmp_path / "run", [a, b]))
    pos = 3 + len(PROMPT_IDS) + at_turn * 14 + at_token
    page = view_page
    with ViewServer.run_in_thread(tmp_path / "run") as srv:
        page.goto(f"{srv.url}/#/groups/pair-group")
        expect(page.get_by_test_id("rollout-row")).to_have_count(2)
        page.get_by_test_id("diff-link").first.click()
        da, db = page.get_by_test_id("diverge-a"), page.get_by_test_id("diverge-b")
        expect(da).to_have_attribute("data-pos", str(pos))
        expect(db).to_have_attribute("data-pos", str(pos))
        ida, idb = int(str(da.get_attribute("data-id"))), int(str(db.get_attribute("data-id")))
        assert {ida, idb} == {100 + 13 * at_turn + at_token, 101 + 13 * at_turn + at_token}
        assert float(str(da.get_attribute("data-lp"))) == pytest.approx(-0.01 * (at_token + 1))
        expect(page.get_by_test_id("diverge-pos")).to_have_text(f"position {pos} (A) / {pos} (B)")
        # The shared prompt once (system, user, the equal first turn), then both sides.
        shared = page.get_by_test_id("diff-shared").get_by_test_id("bubble")
        expect(shared).to_have_count(2 + 2 * at_turn)
        expect(page.get_by_test_id("diff-rest-a").get_by_test_id("bubble")).to_have_count(
            2 * (3 - at_turn))
        # The row's link puts the other rollout of the pair on side A: its ids are one up.
        other = "diff-rest-a" if ida > idb else "diff-rest-b"
        expect(page.get_by_test_id(other)).to_contain_text("(other)")
        # s swaps the sides.
        before = page.get_by_test_id("diff-id-a").inner_text()
        page.keyboard.press("s")
        expect(page.get_by_test_id("diff-id-b")).to_have_text(before)
    assert page.errors == []


def hue(lp: float) -> int:
    return round(max(0.0, min(1.0, math.exp(lp))) * 120)


def test_heat_colours_follow_logprobs(view_page: Any, tmp_path: Path,
                                      eval_runs: tuple[Path, Path]) -> None:
    qwen = build_tokenizer_dir(tmp_path / "qwen25", "qwen25")
    ep, n = chatml_episode(ChatTokenizer(qwen))
    in_thread(write_run(tmp_path / "run", [ep], meta={"name": "heat", "tokenizer": str(qwen)}))
    tr = ep.traces[0]
    lp = tr.columns.logprobs
    page = view_page
    with ViewServer.run_in_thread(tmp_path / "run") as srv:
        page.goto(f"{srv.url}/#/episodes/{ep.id}?tab=tokens")
        page.get_by_test_id("tab-tokens").click()
        cells = page.locator(".tok[data-kind='1']")
        expect(cells).to_have_count(n["answer"])
        hues = []
        for i in range(cells.count()):
            pos = int(str(cells.nth(i).get_attribute("data-pos")))
            h = int(str(cells.nth(i).get_attribute("data-hue")))
            assert h == hue(float(lp[pos]))
            hues.append(h)
        assert hues == sorted(hues) and hues[0] < hues[-1]  # logprobs rise along the answer
        style = str(cells.last.get_attribute("style"))
        assert f"hsl({hues[-1]}, 70%, 78%)" in style
        # Junction tokens and the sampled-but-untrained turn are told apart and off the scale.
        expect(page.locator(".tok[data-kind='3']")).to_have_count(2 * n["junction"] + 1)
        expect(page.locator(".tok[data-kind='2']")).to_have_count(n["cut"])
        assert page.locator(".tok[data-kind='3'][data-hue]").count() == 0
        junction = page.locator(".tok[data-kind='3']").first
        junction.hover()
        expect(page.get_by_test_id("token-info")).to_contain_text("junction")
        expect(page.get_by_test_id("token-info")).to_contain_text('text "\\n"')
        cells.first.hover()
        first_pos = int(str(cells.first.get_attribute("data-pos")))
        expect(page.get_by_test_id("token-info")).to_contain_text(
            f"pos {first_pos} · id {int(tr.columns.ids[first_pos])} · text ")
        expect(page.get_by_test_id("token-info")).to_contain_text(
            f"logprob {float(lp[first_pos]):.4f}")
        # By the extra column: entropy rises along the answer, so the hue falls.
        page.get_by_test_id("token-colour").select_option("extra:entropy")
        expect(page.locator(".tok[data-kind='1'][data-hue='0']")).to_have_count(1)
        ent = [int(str(cells.nth(i).get_attribute("data-hue"))) for i in range(cells.count())]
        assert ent == sorted(ent, reverse=True) and ent[0] == 120
        cells.first.hover()
        expect(page.get_by_test_id("token-info")).to_contain_text("entropy 0.0000")
    # The built-in tokenizer's run (an eval): text pieces and the same heat rule.
    a, _ = eval_runs
    one = next(iter(open_run(a)))
    t0 = one.traces[0]
    with ViewServer.run_in_thread(a) as srv:
        page.goto(f"{srv.url}/#/episodes/{one.id}")
        page.get_by_test_id("tab-tokens").click()
        expect(page.get_by_test_id("token-tokenizer")).to_contain_text("tracewire-tiny")
        sampled = page.locator(".tok[data-kind='1']")
        expect(sampled).to_have_count(int(t0.columns.mask.sum()))
        for i in range(sampled.count()):
            pos = int(str(sampled.nth(i).get_attribute("data-pos")))
            assert int(str(sampled.nth(i).get_attribute("data-hue"))) == hue(
                float(t0.columns.logprobs[pos]))
    assert page.errors == []


def test_run_against_run_page(view_page: Any, eval_runs: tuple[Path, Path]) -> None:
    a, b = eval_runs
    want = expected_compare(a, b)
    page = view_page
    with ViewServer.run_in_thread(a, compare=[b]) as srv:
        page.goto(srv.url + "/")
        page.keyboard.press("c")
        rows = page.get_by_test_id("compare-row")
        expect(rows).to_have_count(len(want))
        got = {str(rows.nth(i).get_attribute("data-task")):
               float(str(rows.nth(i).locator("[data-testid=compare-diff]").get_attribute(
                   "data-value"))) for i in range(rows.count())}
        assert got == pytest.approx(want)
        order = [str(rows.nth(i).get_attribute("data-task")) for i in range(rows.count())]
        assert [want[t] for t in order] == sorted(want.values())  # worse first
        page.get_by_test_id("col-diff").click()
        expect(page.get_by_test_id("col-diff")).to_have_class("sorted-desc")
        expect(rows.first).to_have_attribute("data-task", max(want, key=lambda t: (want[t], t)))
        # A row's diff link: A's best rollout of the task against B's worst, across runs.
        page.get_by_test_id("col-diff").click()
        expect(page.get_by_test_id("col-diff")).to_have_class("sorted-asc")
        page.get_by_test_id("compare-diff-link").first.click()
        expect(page.get_by_test_id("diff-side-b")).to_contain_text(f"run {b.name}")
        expect(page.get_by_test_id("diff-where")).to_contain_text("same task")
        assert page.get_by_test_id("diff-shared").get_by_test_id("bubble").count() >= 2
        page.go_back()
        expect(rows).to_have_count(len(want))
        # Picking this run itself as B: every difference is 0.
        page.get_by_test_id("compare-run").select_option(a.name)
        expect(page.get_by_test_id("compare-counts")).to_contain_text(f"{len(want)} same")
    assert page.errors == []


def shown(x: float) -> str:
    """A number as the page's fmtNum writes it."""
    return str(int(x)) if float(x).is_integer() else f"{x:.3f}"


class GroupWriter:
    """A real store writer on its own loop: appends rollouts of one group, one at a time, each
    first in flight (journal) and then stored."""

    def __init__(self, path: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.path = path

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)

    async def start(self) -> None:
        self.run = await Run.create(self.path, meta={"name": "live-group"}, fsync="never")

    async def begin(self, index: int, reward: float) -> None:
        self.ep: Episode = rollout([[40 + index, 41]], group="live-g", task="live-task",
                                   index=index, reward=reward)
        self.journal = self.run.journal(self.ep)
        self.ep.traces[0].notify()

    async def finish(self) -> None:
        await self.run.append(self.ep)
        self.journal.close()

    async def close(self) -> None:
        await self.run.close()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


def test_group_page_updates_live(view_page: Any, tmp_path: Path) -> None:
    page = view_page
    w = GroupWriter(tmp_path / "live")
    rewards = [1.0, 0.0, 0.5]
    try:
        w.call(w.start())
        w.call(w.begin(0, rewards[0]))
        with ViewServer.run_in_thread(tmp_path / "live", poll_interval=0.1) as srv:
            # Opened while its first rollout still runs: nothing stored, one running.
            page.goto(f"{srv.url}/#/groups/live-g")
            expect(page.get_by_test_id("group-waiting")).to_be_visible()
            expect(page.get_by_test_id("group-live-row")).to_have_count(1)
            w.call(w.finish())
            roll = page.get_by_test_id("rollout-row")
            expect(roll).to_have_count(1)
            for k in (1, 2):
                w.call(w.begin(k, rewards[k]))
                expect(page.get_by_test_id("group-live-row")).to_have_count(1)
                w.call(w.finish())
                expect(roll).to_have_count(k + 1)
                expect(page.get_by_test_id("group-live-row")).to_have_count(0)
                have = np.array(rewards[: k + 1])
                sd = float(have.std())
                expect(page.get_by_test_id("group-stats")).to_have_text(
                    f"{shown(have.mean())} / {shown(sd)}")
                best = roll.first.get_by_test_id("rollout-advantage")
                assert float(str(best.get_attribute("data-value"))) == pytest.approx(
                    (have.max() - have.mean()) / (sd + 1e-6))
            w.call(w.close())
        # The one 404 is the group asked for before any rollout of it was stored (Chromium
        # logs every failed load); anything else is a page error.
        assert [e for e in page.errors if "404 (Not Found)" not in e] == []
        assert len(page.errors) <= 1
    finally:
        w.stop()


def test_step_plots_follow_the_summary_file(view_page: Any, tmp_path: Path) -> None:
    in_thread(write_run(tmp_path / "run", stepped(3, 2)))
    steps = tmp_path / "run" / "train_steps.jsonl"
    page = view_page
    with ViewServer.run_in_thread(tmp_path / "run", poll_interval=0.1) as srv:
        page.goto(srv.url + "/")
        dots = page.locator("[data-testid=reward-over-steps] circle")
        expect(dots).to_have_count(3)  # from the index, before any summary line
        lines = [{"step": s, "reward_mean": 0.1 * s, "mismatch_max": 0.0, "episodes": 2}
                 for s in range(5)]
        steps.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines[:2]))
        expect(dots).to_have_count(2)
        for k in (2, 3, 4):
            with steps.open("ab") as f:
                f.write(orjson.dumps(lines[k]) + b"\n")
            expect(dots).to_have_count(k + 1)
        assert float(str(dots.last.get_attribute("data-value"))) == pytest.approx(0.4)
    assert page.errors == []
