"""Where an eval's rollouts run. ``rollouts(...)`` is the one place that picks a backend.

``local`` (the default) runs every rollout in this process: the model server (given, or
the built-in one started here), one interception proxy, and ``tracewire.env.run_rollout``
per task, each episode journaled while in flight and appended when it ends. ``process``
and ``ray`` send each rollout to an env server's workers (``_backend_serve``). Another
backend implements :class:`Rollouts` and is added to ``Backend``/``BACKENDS``
(``_options``) and to :func:`rollouts`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator
from typing import Protocol

from ..env import Environment, Task, close_http_client, http_client, run_rollout
from ..proxy import Proxy, ProxyConfig
from ..store import RunWriter
from ..trace import Episode
from ._model_server import model_server
from ._options import BACKENDS, Backend, RolloutPlan, ServePlan
from ._tito import make_upstream

__all__ = ["BACKENDS", "Backend", "RolloutPlan", "Rollouts", "ServePlan", "rollouts"]

class Rollouts(Protocol):
    """A started backend: runs one rollout at a time per call, many calls at once."""

    #: The model server's base URL (recorded in the run's meta).
    upstream: str
    #: The model name the rollouts ask for.
    model: str

    async def rollout(self, run: RunWriter, task: Task, episode: Episode) -> Episode:
        """Run ``task`` into ``episode`` and persist it in ``run``; returns the finished
        episode (never raises for rollout failures, which are recorded on it)."""
        ...


class LocalRollouts:
    """Rollouts in this process, through one proxy in front of the model server."""

    def __init__(self, env: Environment, plan: RolloutPlan, proxy: Proxy, upstream: str,
                 model: str) -> None:
        self.env = env
        self.plan = plan
        self.proxy = proxy
        self.upstream = upstream
        self.model = model

    async def rollout(self, run: RunWriter, task: Task, episode: Episode) -> Episode:
        """One in-process rollout, journaled while in flight and appended when done."""
        journal = run.journal(episode)
        try:
            await run_rollout(
                self.env, task, proxy=self.proxy, episode=episode, model=self.model,
                timeouts=self.plan.timeouts, sampling=self.plan.sampling, seed=self.plan.seed,
                on_trace=lambda _t: journal.update(),
            )
            await run.append(episode)
        finally:
            journal.close()
        return episode


@contextlib.asynccontextmanager
async def local_rollouts(env: Environment, plan: RolloutPlan) -> AsyncIterator[LocalRollouts]:
    """Start the model server (unless ``plan.base_url`` names one) and a proxy for ``env``."""
    async with model_server(
        plan.base_url, plan.model, plan.api_key, seed=plan.seed,
        max_model_len=plan.max_model_len,
    ) as (upstream, model):
        config = ProxyConfig(upstream_api_key=plan.api_key)
        up = make_upstream(upstream, config, model=model, tokenizer=plan.tokenizer,
                           upstream_api=plan.upstream_api)
        async with Proxy(up, config=config) as proxy:
            # Made (and the SDK imported) off the loop before the first rollout needs it.
            if env.harness.uses_sdk:
                await http_client()
            try:
                yield LocalRollouts(env, plan, proxy, upstream, model)
            finally:
                await close_http_client()


def rollouts(
    backend: Backend | str, env: Environment, plan: RolloutPlan, serve: ServePlan | None = None
) -> contextlib.AbstractAsyncContextManager[Rollouts]:
    """Start the ``backend`` for ``env`` (``ValueError`` for an unknown one); ``serve``
    sets up the env-server backends (``process``, ``ray``); with ``plan.engine`` the engine
    is started first and the backend runs over it."""
    if plan.engine is not None:
        # Imported here: the engine part only when an eval starts one.
        from ._engine import with_engine

        return with_engine(plan, lambda served: rollouts(backend, env, served, serve))
    if backend == Backend.LOCAL:
        return local_rollouts(env, plan)
    if backend in (Backend.PROCESS, Backend.RAY):
        # Imported here: the serve part (and its ZMQ) only when an env server is used.
        from ._backend_serve import serve_rollouts

        serve = dataclasses.replace(serve or ServePlan(), backend=backend)
        return serve_rollouts(env, plan, serve)
    raise ValueError(f"unknown backend {backend!r} (known: {', '.join(BACKENDS)})")
