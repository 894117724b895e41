from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tracewire.model import ModelServer
from tracewire.proxy import Proxy
from tracewire.runtime import bwrap_usable

AGENTS = Path(__file__).with_name("agents")
#: The venv the tests run in; a Python agent inside bwrap needs it bound read-only.
VENV = sys.prefix
VENV_PYTHON = os.path.join(VENV, "bin", "python")
#: The interpreter itself (always bound into bwrap sandboxes): stdlib-only scripts use it.
PYTHON = os.path.realpath(sys.executable)

BWRAP_REASON = asyncio.run(bwrap_usable())
# The reason starts "bwrap:" either way: tests/conftest.py puts these in the sandbox lane.
needs_bwrap = pytest.mark.skipif(BWRAP_REASON is not None, reason=f"bwrap: {BWRAP_REASON}")


def agent_file(name: str) -> str:
    return (AGENTS / name).read_text()


def procs_with(marker: str) -> list[str]:
    """Command lines of host processes containing ``marker``."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if marker.encode() in cmd:
            found.append(cmd.decode(errors="replace"))
    return found


@pytest.fixture
async def model() -> AsyncIterator[ModelServer]:
    async with ModelServer() as m:
        yield m


@pytest.fixture
async def proxy(model: ModelServer) -> AsyncIterator[Proxy]:
    async with Proxy(model.base_url) as p:
        yield p
