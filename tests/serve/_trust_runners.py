"""Runner factory for the trust tests, loaded by worker processes as a module path."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from tracewire.serve import Runner, standin_runner
from tracewire.trace import Episode


@contextlib.asynccontextmanager
async def stubborn_or_standin(env: str, options: dict[str, Any]) -> AsyncIterator[Runner]:
    """The stand-in runner, except that a task with ``stubborn`` ignores cancellation."""
    standin = standin_runner()

    async def run(task: dict[str, Any], episode: Episode) -> None:
        if not task.get("stubborn"):
            await standin(task, episode)
            return
        while True:
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                continue

    yield run
