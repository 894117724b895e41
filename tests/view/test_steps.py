"""Train runs in the viewer: step / policy_version columns (sorted, filtered) and the
reward-over-steps plot, from a real ``tracewire train`` run and from hand-made runs."""

from __future__ import annotations

import asyncio
import concurrent.futures
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from playwright.sync_api import expect

from tracewire.store import open_run
from tracewire.trace import Episode
from tracewire.train import TrainConfig, train
from tracewire.view import ViewServer

from .builders import tool_episode, write_run
from .test_api import get_json

STEPS = 3


@pytest.fixture(scope="module")
def train_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real train run: 3 steps of 2 tasks x 2 rollouts on the built-in model."""
    out = tmp_path_factory.mktemp("train") / "run"
    cfg = TrainConfig(steps=STEPS, group_size=2, tasks_per_step=2, lr=5.0, concurrency=4)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, train("arithmetic", cfg, out=out)).result()
    return out


def stepped(n_steps: int, per_step: int) -> list[Episode]:
    """Episodes with ``info.step`` / ``info.policy_version`` and rewards known per step."""
    eps = []
    for s in range(n_steps):
        for k in range(per_step):
            ep = tool_episode(s * per_step + k, reward=round(0.1 * s + 0.05 * k, 3), env="arith")
            ep.info["step"] = s
            ep.info["policy_version"] = max(0, s - 1)
            eps.append(ep)
    return eps


async def test_train_run_steps_from_its_summary_file(train_run: Path) -> None:
    lines = [orjson.loads(x) for x in (train_run / "train_steps.jsonl").read_bytes().splitlines()]
    async with ViewServer(train_run) as srv, aiohttp.ClientSession() as s:
        info = await get_json(s, srv.url + "/api/run")
        steps = await get_json(s, srv.url + "/api/steps")
    assert info["columns"] == ["step", "policy_version"]
    assert steps["source"] == "train_steps.jsonl" and steps["step"] == list(range(STEPS))
    assert steps["reward"] == [x["reward_mean"] for x in lines]
    assert steps["mismatch_max"] == [x["mismatch_max"] for x in lines] == [0.0] * STEPS
    assert steps["staleness"] == [0.0] * STEPS and steps["n"] == [4.0] * STEPS
    # The built-in model's run: its tokenizer is known, so the token view shows text.
    assert info["tokenizer"]["kind"] == "builtin"


async def test_train_run_index_sorted_and_filtered_by_step(train_run: Path) -> None:
    run = open_run(train_run)
    by_id = {ep.id: ep for ep in run}
    async with ViewServer(train_run) as srv, aiohttp.ClientSession() as s:
        url = srv.url + "/api/episodes"
        page = await get_json(s, url + "?sort=step&order=desc&limit=500")
        got = [r["step"] for r in page["rows"]]
        assert got == sorted(got, reverse=True) and got[0] == STEPS - 1
        for r in page["rows"]:
            assert r["step"] == by_id[r["id"]].info["step"]
            assert r["policy_version"] == by_id[r["id"]].info["policy_version"]
        page = await get_json(s, url + "?step_min=1&step_max=1&limit=500")
        assert page["total"] == 4 and {r["step"] for r in page["rows"]} == {1}
        page = await get_json(s, url + "?policy_version_min=2&limit=500")
        assert {r["policy_version"] for r in page["rows"]} == {2} and page["total"] == 4
        await get_json(s, url + "?step_min=abc", 400)


async def test_steps_from_the_index_without_a_summary_file(tmp_path: Path) -> None:
    eps = stepped(4, 3)
    await write_run(tmp_path / "run", eps)
    async with ViewServer(tmp_path / "run") as srv, aiohttp.ClientSession() as s:
        steps = await get_json(s, srv.url + "/api/steps")
    assert steps["source"] == "index" and steps["step"] == [0, 1, 2, 3]
    assert steps["n"] == [3, 3, 3, 3]
    want = [sum(e.reward for e in eps if e.info["step"] == k) / 3 for k in range(4)]
    assert steps["reward"] == pytest.approx(want)
    assert "mismatch_max" not in steps


async def test_summary_file_lines_that_do_not_parse_are_skipped(tmp_path: Path) -> None:
    await write_run(tmp_path / "run", stepped(2, 1))
    good = [{"step": 0, "reward_mean": 0.25, "mismatch_max": 0.0, "episodes": 1},
            {"step": 1, "reward_mean": 0.5, "mismatch_max": 0.125, "episodes": 1}]
    (tmp_path / "run" / "train_steps.jsonl").write_bytes(
        orjson.dumps(good[0]) + b"\n[1, 2]\n{torn" + b"\n" + orjson.dumps(good[1])
        + b'\n{"step": 2, "reward_mean": NaN')
    async with ViewServer(tmp_path / "run") as srv, aiohttp.ClientSession() as s:
        steps = await get_json(s, srv.url + "/api/steps")
    assert steps["step"] == [0, 1] and steps["reward"] == [0.25, 0.5]
    assert steps["mismatch_max"] == [0.0, 0.125]


async def test_a_run_without_steps_has_no_step_plot_or_columns(tmp_path: Path) -> None:
    await write_run(tmp_path / "run", [tool_episode(1, reward=1.0, env="a")])
    async with ViewServer(tmp_path / "run") as srv, aiohttp.ClientSession() as s:
        steps = await get_json(s, srv.url + "/api/steps")
        info = await get_json(s, srv.url + "/api/run")
    assert steps == {"source": None, "step": [], "reward": [], "n": []}
    assert info["columns"] == []


# Browser tests stay last in the module: the module-scoped Playwright browser keeps an
# event loop on this thread from its first use on, which async tests after it would trip on.
@pytest.mark.browser
def test_run_page_plots_reward_over_steps(view_page: Any, train_run: Path) -> None:
    lines = [orjson.loads(x) for x in (train_run / "train_steps.jsonl").read_bytes().splitlines()]
    page = view_page
    with ViewServer.run_in_thread(train_run) as srv:
        page.goto(srv.url + "/")
        dots = page.locator("[data-testid=reward-over-steps] circle")
        expect(dots).to_have_count(STEPS)
        for i, line in enumerate(lines):
            assert float(dots.nth(i).get_attribute("data-value")) == pytest.approx(
                line["reward_mean"])
            assert dots.nth(i).get_attribute("data-step") == str(i)
        expect(page.locator("[data-testid=mismatch-over-steps] circle")).to_have_count(STEPS)
        # The step column sorts; the step filter selects one step's episodes.
        page.get_by_test_id("col-step").click()
        expect(page.get_by_test_id("col-step")).to_have_class("sorted-asc")
        page.get_by_test_id("col-step").click()
        expect(page.get_by_test_id("episode-row").first.locator("td").nth(13)).to_have_text(
            str(STEPS - 1))
        page.get_by_test_id("filter-step_min").fill("1")
        page.get_by_test_id("filter-step_max").fill("1")
        page.get_by_test_id("apply").click()
        expect(page.get_by_test_id("episode-row")).to_have_count(4)
        expect(page.get_by_test_id("col-policy_version")).to_be_visible()
        row = page.get_by_test_id("episode-row").first
        eid = row.get_attribute("data-id")
        row.click()
        ep = open_run(train_run).get(str(eid))
        expect(page.get_by_test_id("episode-step")).to_have_text(
            f"{ep.info['step']} / {ep.info['policy_version']}")
    assert page.errors == []
