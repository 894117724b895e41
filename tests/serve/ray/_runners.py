"""Runner factories for the Ray suite, loaded by workers as ``tests.serve.ray._runners:...``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from tracewire.serve import Runner
from tracewire.trace import Episode


@contextlib.asynccontextmanager
async def stubborn_factory(env: str, options: dict[str, Any]) -> AsyncIterator[Runner]:
    """A runner that ignores cancellation: the worker looks alive but never lets go."""

    async def run(task: dict[str, Any], episode: Episode) -> None:
        while True:
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                continue

    yield run
