"""A terminal-summary section saying which agent-CLI tests ran, so a CI log shows the
vendors' CLIs were exercised (passed, failed or skipped, and where each CLI was found)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

_AGENTS = {"claude": "claude", "codex": "codex", "mini": "mini"}
_seen: list[tuple[str, str]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if "tests/examples/test_agents.py" not in report.nodeid.replace("\\", "/"):
        return
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        _seen.append((report.nodeid.rpartition("::")[2], report.outcome))


def _where(exe: str) -> str:
    if exe == "mini":
        here = Path(sys.prefix) / "bin" / "mini"
        if here.exists():
            return str(here)
    return shutil.which(exe) or "not installed"


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _seen:
        return
    tr = terminalreporter
    tr.section("agent CLIs")
    for exe in _AGENTS:
        tr.write_line(f"{exe}: {_where(exe)}")
    for name, outcome in _seen:
        tr.write_line(f"{outcome.upper():8} {name}")
