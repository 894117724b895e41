"""Fixtures: real env servers (broker in the test's loop, workers as real subprocesses)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from tracewire.serve import EnvClient, EnvServer, ServerConfig

ADDRESS = "tcp://127.0.0.1:0"  # a random free port, resolved by the server

# Ray listens on every interface it sees: its tests run only inside the private network
# namespace that test_ray.py creates for them (it sets TRACEWIRE_NETNS there).
if os.environ.get("TRACEWIRE_NETNS") != "1":
    collect_ignore = ["ray"]


@contextlib.asynccontextmanager
async def serving(options: dict[str, Any] | None = None, ready: bool = True,
                  **config: Any) -> AsyncIterator[EnvServer]:
    """An EnvServer of the stand-in environment on a random loopback port."""
    server = EnvServer("standin", address=ADDRESS, config=ServerConfig(**config),
                       options=options)
    await server.start()
    try:
        if ready:
            await server.wait_ready(timeout=60)
        yield server
    finally:
        await server.stop(drain=False, timeout=5)


@contextlib.asynccontextmanager
async def client_of(*servers: EnvServer, **kw: Any) -> AsyncIterator[EnvClient]:
    async with EnvClient([s.address for s in servers], **kw) as client:
        yield client


async def until(pred: Callable[[], Awaitable[bool]] | Callable[[], bool], what: str,
                limit: float = 20.0) -> None:
    """Poll ``pred`` until true; fail (not hang) after ``limit`` seconds."""
    deadline = time.monotonic() + limit
    while True:
        got = pred()
        if asyncio.iscoroutine(got):
            got = await got
        if got:
            return
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        await asyncio.sleep(0.02)
