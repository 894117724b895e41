"""Browser fixtures: headless Debian Chromium driven by Playwright's sync API.

No pytest-playwright fixtures are used (its own ``base_url`` fixture trips warnings-as-errors);
the browser is launched here with the system binary. When no Chromium can be launched the
browser tests are SKIPPED with the reason and how to install it (``make test`` on a fresh
machine must not end in errors); with ``TRACEWIRE_REQUIRE_BROWSER=1`` (set by ``.ci/run``,
which installs Chromium) they fail instead, so CI never loses them silently. On failure each
test leaves a screenshot under ``test-artifacts/view/``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "view"
CHROMIUM_CANDIDATES = ("/usr/lib/chromium/chromium", "/usr/bin/chromium",
                       "/usr/bin/chromium-browser")
LAUNCH_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--no-first-run"]


def find_chromium() -> str | None:
    """Path of the system Chromium, or None."""
    env = os.environ.get("TRACEWIRE_CHROMIUM")
    for cand in ((env,) if env else ()) + CHROMIUM_CANDIDATES:
        if cand and os.access(cand, os.X_OK):
            return cand
    found = shutil.which("chromium")
    return found


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    rep = yield
    setattr(item, "rep_" + rep.when, rep)
    return rep


def _no_browser(why: str) -> NoReturn:
    reason = (
        f"{why}: the viewer's browser tests need Debian's chromium package (run "
        "`apt-get update && apt-get install -y chromium`, or set TRACEWIRE_CHROMIUM to the "
        "binary)"
    )
    if os.environ.get("TRACEWIRE_REQUIRE_BROWSER") == "1":
        pytest.fail(reason + "; TRACEWIRE_REQUIRE_BROWSER=1 makes this a failure", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """A launched headless Chromium browser (Playwright ``Browser``). Module-scoped: the
    sync Playwright API keeps an event loop running in this thread while it is open, which
    would break every asyncio test run after it."""
    path = find_chromium()
    if path is None:
        _no_browser("Chromium not found")
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        try:
            browser = p.chromium.launch(executable_path=path, headless=True, args=LAUNCH_ARGS)
        except PlaywrightError as exc:
            _no_browser(f"Chromium at {path} cannot be launched ({str(exc).splitlines()[0]})")
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def view_page(chromium: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A fresh page (1280x900); screenshot saved to test-artifacts/view/ if the test fails.
    Console errors of the page are collected in ``page.errors`` and checked by the tests."""
    context = chromium.new_context(viewport={"width": 1280, "height": 900})
    pg = context.new_page()
    pg.set_default_timeout(15_000)
    # expect() has its own 5 s default, too short for a live update on a loaded 2-core CI
    # machine; an assertion that holds still passes at once.
    from playwright.sync_api import expect

    expect.set_options(timeout=15_000)
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    pg.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    pg.errors = errors
    try:
        yield pg
    finally:
        rep = getattr(request.node, "rep_call", None)
        if rep is not None and rep.failed:
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            name = request.node.name.replace("/", "_")
            try:
                pg.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
                (ARTIFACTS / f"{name}.log").write_text("\n".join(errors))
            except Exception as exc:  # the page may be gone; the test already failed
                print(f"could not save screenshot: {exc}")
        context.close()
