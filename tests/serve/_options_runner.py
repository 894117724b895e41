"""A runner factory that reports the options it was given, loaded by worker processes as a
module path (tests/serve/test_cli.py)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from tracewire.serve import Runner
from tracewire.trace import Episode, StopReason


@contextlib.asynccontextmanager
async def options_factory(env: str, options: dict[str, Any]) -> AsyncIterator[Runner]:
    """Each episode holds one trace whose ``agent`` names ``env`` and the factory's options
    (keys in the order they arrived)."""

    async def run(task: dict[str, Any], episode: Episode) -> None:
        trace = episode.new_trace(agent={"name": "options", "env": env,
                                         "options": options, "keys": list(options)})
        trace.stop = StopReason.MAX_TURNS
        trace.completed = True
        trace.notify()

    yield run
