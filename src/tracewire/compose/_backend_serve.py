"""Rollouts on env-server workers: ``process`` (local worker processes) or ``ray`` (actors).

The eval process starts the model server (given, or the built-in one on loopback), an env
server whose workers each run :func:`serve_factory` (the environment and one proxy in
front of that model server), and one client; each rollout is one ``run`` call whose deltas
stream to this process, where the episode assembled from them is journaled as they arrive
(as a local rollout is) and appended when it ends. A client killed mid-rollout so keeps
what it received: ``--resume`` stores it as an incomplete episode. The eval's identity of
an episode (group, rollout index, run) rides in the task request, so the worker's episode
is keyed and seeded exactly as a local one: ``--resume`` works across backends.

At most once: a run the server fails (``WorkerDiedError``, ``RunTimeout``, ``BusyError``)
is stored as a failed rollout marked incomplete (with the turns received before the
failure), never retried here; ``--resume`` runs it again when asked.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from .._errors import ServeError
from ..env import Environment, Task, Timeouts, close_http_client, load_environment, run_rollout
from ..proxy import Proxy, ProxyConfig
from ..serve import EnvClient, Runner, ServerConfig, make_pool, serve_env
from ..store import Journal, RunWriter
from ..trace import Episode, InfoKey, StopReason
from ._model_server import model_server
from ._options import DEFAULT_UPSTREAM_API, Backend, RolloutPlan, ServePlan
from ._runtime import with_runtime
from ._tito import make_upstream

__all__ = ["ServeRollouts", "serve_factory", "serve_rollouts"]


def _run_timeout(env: Environment, timeouts: Timeouts | None) -> float:
    # The server's per-episode deadline must not cut a rollout a local eval would let run:
    # every phase of every attempt, plus a margin for the worker's own work.
    t = timeouts or env.timeouts
    phases = [t.of(p) for p in ("boot", "setup", "agent", "finalize", "scoring")]
    if any(v is None for v in phases):
        return 7 * 86400.0  # no deadline asked for: a week stands for none
    return sum(v for v in phases if v is not None) * (1 + max(0, env.retries)) + 60.0


def worker_ref(ref: str) -> str:
    """``ref`` as workers must load it: a ``.py`` file path made absolute (a Ray actor's
    working directory is not the eval's); other references unchanged."""
    module, sep, attr = ref.strip().partition(":")
    if module.endswith(".py") or "/" in module:
        path = Path(module)
        if path.is_file():
            return f"{path.resolve()}{sep}{attr}"
    return ref


def _request(task: Task, episode: Episode) -> dict[str, Any]:
    # "key" is what the worker names the episode's task by; the rest is this module's.
    return {"key": task.key, "data": dict(task.data), "episode": {
        "group_id": episode.group_id, "group_index": episode.group_index, "run": episode.run}}


@contextlib.asynccontextmanager
async def serve_factory(env: str, options: dict[str, Any]) -> AsyncIterator[Runner]:
    """A worker's runner for eval requests: options ``base_url``, ``model``, ``api_key``,
    ``sampling``, ``seed``, ``timeouts`` (a dict of phase deadlines), ``runtime`` (a
    runtime name for a command harness's agent) and ``tokenizer``/``upstream_api``
    (token-in/token-out), as in a local eval."""
    runtime = options.get("runtime")
    environment = with_runtime(load_environment(env), str(runtime) if runtime else None,
                               ro_paths=list(options.get("ro_paths") or ()),
                               sandbox_paths=list(options.get("sandbox_paths") or ()))
    raw = options.get("timeouts")
    timeouts = Timeouts(**raw) if isinstance(raw, dict) else None
    key = options.get("api_key")
    tok = options.get("tokenizer")
    config = ProxyConfig(upstream_api_key=str(key) if key else None)
    sampling = dict(options.get("sampling") or {})
    seed = int(options.get("seed", 0))
    model = str(options["model"])
    upstream = make_upstream(str(options["base_url"]), config, model=model,
                             tokenizer=str(tok) if tok else None,
                             upstream_api=str(options.get("upstream_api") or DEFAULT_UPSTREAM_API))
    async with Proxy(upstream, config=config) as proxy:

        async def run(request: dict[str, Any], episode: Episode) -> None:
            ident = request.get("episode") or {}
            task = Task(key=str(request.get("key", "")), data=dict(request.get("data") or {}))
            # Before the rollout: the seed is derived from the rollout index.
            episode.task = dict(task.data)
            episode.group_id = ident.get("group_id")
            episode.group_index = int(ident.get("group_index", 0))
            episode.run = str(ident.get("run", ""))
            await run_rollout(environment, task, proxy=proxy, episode=episode, model=model,
                              timeouts=timeouts, sampling=sampling, seed=seed)

        try:
            yield run
        finally:
            await close_http_client()  # the SDK harnesses' shared client, if one was made


def failed_rollout(episode: Episode, exc: ServeError) -> Episode:
    """``episode`` as a rollout the env server failed: one trace stopped ``serve_error`` with
    the error, marked incomplete (so ``--resume`` runs it again)."""
    trace = episode.traces[0] if episode.traces else episode.new_trace()
    trace.stop = StopReason.SERVE_ERROR
    trace.add_error(type(exc).__name__, str(exc), phase="serve")
    episode.add_error(type(exc).__name__, str(exc), phase="serve")
    episode.info[InfoKey.INCOMPLETE] = True
    return episode


class ServeRollouts:
    """Rollouts sent to an env server's workers, journaled as their deltas arrive."""

    def __init__(self, client: EnvClient, upstream: str, model: str) -> None:
        self.client = client
        self.upstream = upstream
        self.model = model

    async def rollout(self, run: RunWriter, task: Task, episode: Episode) -> Episode:
        """One rollout on a worker, journaled while in flight; a server failure is stored
        as a failed rollout (the part received, if any)."""
        journal: Journal | None = None

        def on_delta(_delta: object, received: Episode) -> None:
            # On the receive loop, after each delta is applied to ``received``.
            nonlocal journal
            if journal is None:
                journal = run.journal(received)
            else:
                journal.update()

        try:
            try:
                res = await self.client.run(_request(task, episode), on_delta=on_delta)
            except ServeError as exc:
                # The worker's own episode (its id names the journal), as far as it came.
                failed = failed_rollout(journal.episode if journal else episode, exc)
                await run.append(failed)
                return failed
            await run.append(res.episode)  # deletes its journal once stored
            return res.episode
        finally:
            if journal is not None:
                journal.close()


@contextlib.asynccontextmanager
async def serve_rollouts(env: Environment, plan: RolloutPlan,
                         serve: ServePlan) -> AsyncIterator[ServeRollouts]:
    """Start the model server (unless ``plan.base_url`` names one) and an env server of
    ``serve.backend`` whose workers load ``serve.env_ref`` (default: ``env.name``)."""
    pool = serve.pool or make_pool(serve.backend, ray_address=serve.ray_address,
                                   worker_cpus=serve.worker_cpus,
                                   worker_resources=dict(serve.worker_resources or {}) or None)
    prepare = getattr(pool, "prepare", None)
    if callable(prepare):
        # Joining Ray blocks; the CLI does it before the loop runs, so this returns at once
        # there. Nothing else runs on the loop yet.
        prepare()
    async with model_server(
        plan.base_url, plan.model, plan.api_key, seed=plan.seed,
        max_model_len=plan.max_model_len,
    ) as (upstream, model):
        options: dict[str, Any] = {
            "base_url": upstream, "model": model, "api_key": plan.api_key,
            "sampling": dict(plan.sampling), "seed": plan.seed,
            "timeouts": dataclasses.asdict(plan.timeouts) if plan.timeouts else None,
            "runtime": serve.runtime, "ro_paths": list(serve.ro_paths),
            "sandbox_paths": list(serve.sandbox_paths),
            "tokenizer": plan.tokenizer, "upstream_api": plan.upstream_api,
        }
        workers = max(1, serve.workers)
        # Room for every rollout the eval keeps in flight, so none is refused as busy.
        inflight = max(1, serve.concurrency)
        run_timeout = _run_timeout(env, plan.timeouts)
        config = ServerConfig(workers=workers, max_inflight=inflight, run_timeout=run_timeout,
                              heartbeat_timeout=2.0 if serve.backend == Backend.RAY else 5.0)
        ref = worker_ref(serve.env_ref) if serve.env_ref else env.name
        async with serve_env(ref, pool=pool, workers=workers,
                             factory=serve_factory, options=options, config=config,
                             client_timeout=run_timeout + 60.0) as client:
            yield ServeRollouts(client, upstream, model)
