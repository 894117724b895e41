"""Runner factory for real environments: ``tracewire.env`` rollouts through a proxy.

Each worker loads the environment once, starts the built-in model (unless ``base_url`` is
given in the options) and one interception proxy, then runs each task with
``tracewire.env.run_rollout`` into the episode the worker streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
from collections.abc import AsyncIterator
from typing import Any

from .._errors import EnvError
from ..trace import Episode
from ._runner import Runner

__all__ = ["env_factory"]


def _part(name: str) -> Any:
    try:
        return importlib.import_module(f"tracewire.{name}")
    except ImportError as exc:
        raise EnvError(f"serving real environments needs tracewire.{name}: {exc}") from exc


@contextlib.asynccontextmanager
async def env_factory(env: str, options: dict[str, Any]) -> AsyncIterator[Runner]:
    """Yield a runner for environment ``env``; options ``base_url`` and ``timeouts``."""
    envmod, proxymod = _part("env"), _part("proxy")
    environment = envmod.load_environment(env)
    raw = options.get("timeouts")
    timeouts = envmod.Timeouts(**raw) if isinstance(raw, dict) else None
    async with contextlib.AsyncExitStack() as stack:
        base_url = options.get("base_url")
        if not base_url:
            # The built-in model samples on its own thread and loop, as evaluate() runs it,
            # so its CPU work does not stall the loop streaming episodes.
            server = await asyncio.to_thread(_part("model").ModelServer.run_in_thread)
            stack.push_async_callback(asyncio.to_thread, server.stop)
            base_url = server.base_url
        proxy = proxymod.Proxy(str(base_url))
        await proxy.start()
        stack.push_async_callback(proxy.stop)

        async def run(task: dict[str, Any], episode: Episode) -> None:
            await envmod.run_rollout(environment, task, proxy=proxy, episode=episode,
                                     timeouts=timeouts)

        yield run
