"""The env server's runner factory for real environments: ``tracewire.env`` rollouts
through a proxy.

Each worker loads the environment once, starts the built-in model (unless the options name
a ``base_url``) and one interception proxy, then runs each task with
:func:`tracewire.env.run_rollout` into the episode the worker streams. The ``serve``
command hands it to the env server, whose worker processes load it by its own name.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from ..serve import Runner
from ..trace import Episode

__all__ = ["env_factory"]


@contextlib.asynccontextmanager
async def env_factory(env: str, options: dict[str, Any]) -> AsyncIterator[Runner]:
    """Yield a runner for environment ``env``; options ``base_url`` (with ``model``),
    ``timeouts`` (a dict of phase deadlines), ``max_model_len`` (built-in model),
    ``runtime`` (where a command harness's agent runs: ``local``, ``bwrap``, ``docker``) and
    ``tokenizer``/``upstream_api`` (token-in/token-out)."""
    # Imported here: `tracewire serve` names this factory without loading env, model and
    # proxy into the broker's process; only its workers call it.
    from ..env import Timeouts, load_environment, run_rollout
    from ..model import MAX_MODEL_LEN, MODEL_NAME, ModelServer
    from ..proxy import Proxy, ProxyConfig
    from ._options import DEFAULT_UPSTREAM_API
    from ._runtime import with_runtime
    from ._tito import make_upstream

    runtime = options.get("runtime")
    environment = with_runtime(load_environment(env), str(runtime) if runtime else None,
                               ro_paths=list(options.get("ro_paths") or ()),
                               sandbox_paths=list(options.get("sandbox_paths") or ()))
    raw = options.get("timeouts")
    timeouts = Timeouts(**raw) if isinstance(raw, dict) else None
    model = str(options.get("model") or MODEL_NAME)
    async with contextlib.AsyncExitStack() as stack:
        base_url = options.get("base_url")
        if not base_url:
            raw_len = options.get("max_model_len")
            max_len = MAX_MODEL_LEN if raw_len is None else int(raw_len)
            # The built-in model samples on its own thread and loop, so its CPU work does
            # not stall the loop streaming episodes.
            server = await asyncio.to_thread(ModelServer.run_in_thread, max_model_len=max_len)
            stack.push_async_callback(asyncio.to_thread, server.stop)
            base_url = server.base_url
        tok = options.get("tokenizer")
        config = ProxyConfig()
        api = str(options.get("upstream_api") or DEFAULT_UPSTREAM_API)
        upstream = make_upstream(str(base_url), config, model=model,
                                 tokenizer=str(tok) if tok else None, upstream_api=api)
        proxy = Proxy(upstream, config=config)
        await proxy.start()
        stack.push_async_callback(proxy.stop)

        async def run(task: dict[str, Any], episode: Episode) -> None:
            await run_rollout(environment, task, proxy=proxy, episode=episode, model=model,
                              timeouts=timeouts)

        yield run
