"""Screenshots of each viewer page at 1280x800 for docs/VIEWER.md (not a test).

Builds a real train run, two real eval runs and a token-in/token-out style episode, serves
them, and saves one PNG per page: ``python -m tests.view.make_screenshots docs/img``
(from the repository root, with ``PYTHONPATH=src``).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from playwright.sync_api import sync_playwright

from tracewire.store import open_run
from tracewire.tito import ChatTokenizer
from tracewire.tito.fixtures import build_tokenizer_dir
from tracewire.view import ViewServer

from .builders import write_run
from .conftest import LAUNCH_ARGS, find_chromium
from .rl_builders import in_thread, make_eval_runs, make_train_run
from .test_rl_api import chatml_episode


def shoot(page: object, url: str, path: Path, wait: str) -> None:
    page.goto(url)  # type: ignore[attr-defined]
    page.wait_for_selector(wait)  # type: ignore[attr-defined]
    page.wait_for_timeout(400)  # type: ignore[attr-defined]
    page.screenshot(path=str(path))  # type: ignore[attr-defined]


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        train = make_train_run(base / "train")
        a, b = make_eval_runs(base / "eval-a", base / "eval-b")
        ep, _ = chatml_episode(ChatTokenizer(build_tokenizer_dir(base / "qwen25", "qwen25")))
        in_thread(write_run(base / "tito", [ep], meta={"name": "tito", "tokenizer": "qwen25"}))
        # Named relative to the run (no machine path in the picture): a copy next to it.
        build_tokenizer_dir(base / "tito" / "qwen25", "qwen25")
        rows = open_run(a).rows()
        mixed = next(g for g in {r.group_id for r in rows}
                     if len({r.reward for r in rows if r.group_id == g}) > 1)
        members = sorted((r for r in rows if r.group_id == mixed), key=lambda r: -r.reward)
        chromium = find_chromium()
        assert chromium is not None, "needs Chromium"
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, headless=True, args=LAUNCH_ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            with ViewServer.run_in_thread(train) as srv:
                shoot(page, srv.url + "/", out / "index.png", "[data-testid=reward-over-steps]")
                shoot(page, srv.url + "/#/groups", out / "groups.png", "[data-testid=group-row]")
                first = page.get_by_test_id("group-row").first.get_attribute("data-group")
                shoot(page, f"{srv.url}/#/groups/{first}", out / "group.png",
                      "[data-testid=rollout-row]")
            with ViewServer.run_in_thread(a, compare=[b]) as srv:
                shoot(page, f"{srv.url}/#/diff?a={members[0].episode_id}"
                            f"&b={members[-1].episode_id}", out / "diff.png",
                      "[data-testid=diff-shared]")
                shoot(page, srv.url + "/#/compare", out / "compare.png",
                      "[data-testid=compare-row]")
            with ViewServer.run_in_thread(base / "tito") as srv:
                shoot(page, f"{srv.url}/#/episodes/{ep.id}?tab=tokens", out / "tokens.png",
                      "[data-testid=token-view] .tok")
                page.evaluate("window.scrollTo(0, 410)")
                page.locator(".tok[data-kind='3']").first.hover()
                page.screenshot(path=str(out / "tokens.png"))
            browser.close()


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/img"))
