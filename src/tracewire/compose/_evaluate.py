"""``evaluate_plan``: run an eval's plan (an environment's tasks × rollouts) into a stored run.

The rollouts run on a backend (``local``: in this process, through an interception proxy in
front of the model server; see ``_backend``) with bounded concurrency; R rollouts per task
share a group id and the rollout index is the group index. A ``stop`` event (Ctrl-C in the
CLI) or cancellation stops cleanly: finished episodes are kept and the run is closed as
``interrupted``.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._errors import EnvError
from ..diagnostics import LoopLagProbe
from ..env import Environment, Task, load_environment
from ..store import Run, RunReader, RunStatus, RunWriter, open_run
from ..trace import Episode
from ._backend import Rollouts, rollouts
from ._options import RolloutPlan, ServePlan
from ._plan import EvalOptions, EvalPlan
from ._runtime import with_runtime
from ._summary import Summary, Tally

if TYPE_CHECKING:
    # Typed keyword options on 3.11 as well; annotations are never evaluated at run time.
    from typing_extensions import Unpack

__all__ = ["EvalResult", "default_run_dir", "evaluate", "evaluate_plan"]

#: ``on_episode(episode, tally)``: called as each episode is stored.
EpisodeCallback = Callable[[Episode, Tally], None]
#: ``total_hint(n)``: called once with the number of rollouts to run (None: unknown).
TotalHint = Callable[[int | None], None]


@dataclass
class EvalResult:
    """What :func:`evaluate` returns: the run (open for reading), its summary, how it ended
    (``complete`` or ``interrupted``) and, when no rollout got a model answer, why."""

    run: RunReader
    summary: Summary
    status: RunStatus
    reason: str | None = None


def default_run_dir(env_name: str) -> Path:
    """``runs/<env>-<YYYYmmdd-HHMMSS>`` (a numeric suffix when taken)."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in env_name) or "env"
    base = Path("runs") / f"{safe}-{time.strftime('%Y%m%d-%H%M%S')}"
    path, i = base, 1
    while path.exists():
        path, i = Path(f"{base}-{i}"), i + 1
    return path


def _group_id(run_key: str, task_key: str) -> str:
    # Stable across --resume, so a resumed group keeps its id.
    return hashlib.blake2b(f"{run_key}\0{task_key}".encode(), digest_size=16).hexdigest()


async def _open_run(out: Path, resume: bool, meta: dict[str, Any]) -> RunWriter:
    exists = await asyncio.to_thread(lambda: (out / "meta.json").exists())
    if resume and not exists:
        raise EnvError(f"--resume: {out} holds no run")
    if not resume and exists:
        raise EnvError(f"{out} already holds a run (use --resume to continue it)")
    # With resume, Run.create recovers the run and appends after its episodes.
    return await Run.create(out, meta=meta, resume=resume)


def _work(
    tasks: Iterator[Task], r: int, done: set[tuple[str, int]], skipped: list[int]
) -> Iterator[tuple[Task, int]]:
    for task in tasks:
        for i in range(r):
            if (task.key, i) in done:
                skipped[0] += 1
                continue
            yield task, i


async def evaluate(
    env: Environment | str,
    *,
    stop: asyncio.Event | None = None,
    on_episode: EpisodeCallback | None = None,
    total_hint: TotalHint | None = None,
    **options: Unpack[EvalOptions],
) -> EvalResult:
    """Run ``env``'s tasks through the proxy into a stored run: :func:`evaluate_plan` of
    ``EvalPlan.from_options(env, **options)`` (each option is a field of one of
    :class:`EvalPlan`'s groups, where it is documented)."""
    plan = EvalPlan.from_options(env, **options)
    return await evaluate_plan(plan, stop=stop, on_episode=on_episode, total_hint=total_hint)


async def evaluate_plan(
    plan: EvalPlan,
    *,
    stop: asyncio.Event | None = None,
    on_episode: EpisodeCallback | None = None,
    total_hint: TotalHint | None = None,
) -> EvalResult:
    """Run ``plan``: ``plan.scale.n`` tasks (all by default) × ``plan.scale.r`` rollouts of
    its environment, loaded once here, into a stored run.

    Every turn goes through an interception proxy, so the traces are token-exact; with
    ``plan.output.resume`` the (task, rollout) pairs already in the run are skipped.
    Setting ``stop`` ends the eval early (status ``interrupted``, finished episodes kept).
    ``on_episode`` sees each stored episode with the running tally; ``total_hint`` gets the
    number of rollouts to run once it is known.
    """
    model, scale, sandbox, where = plan.model, plan.scale, plan.sandbox, plan.placement
    env = load_environment(plan.env)
    # Env-server workers load the environment themselves, by the reference it was found by.
    serve = ServePlan(workers=where.workers, concurrency=scale.concurrency,
                      env_ref=plan.env if isinstance(plan.env, str) else env.ref,
                      ray_address=where.ray_address, worker_cpus=where.worker_cpus,
                      worker_resources=where.worker_resources,
                      runtime=sandbox.runtime if isinstance(sandbox.runtime, str) else None,
                      ro_paths=sandbox.ro_paths, sandbox_paths=sandbox.sandbox_paths)
    env = with_runtime(env, sandbox.runtime, ro_paths=sandbox.ro_paths,
                       sandbox_paths=sandbox.sandbox_paths)
    out_path = plan.output.out if plan.output.out is not None else default_run_dir(env.name)
    sampling = plan.sampling.overrides()
    seed = plan.sampling.seed
    engine = model.engine
    rollout_plan = RolloutPlan(
        base_url=model.base_url, model=None if engine else model.model, api_key=model.api_key,
        seed=seed, max_model_len=model.max_model_len, sampling=sampling,
        timeouts=sandbox.timeouts, tokenizer=model.tokenizer, upstream_api=model.upstream_api,
        engine=engine, engine_model=model.model if engine else None,
        # A slot per rollout in flight, at most 4: the engine batches them, and each slot
        # costs its own KV cache.
        engine_parallel=max(1, min(scale.concurrency, 4)))
    n, r, concurrency = scale.n, scale.r, scale.concurrency
    resume = plan.output.resume
    tally = Tally()
    status = RunStatus.COMPLETE
    lag: float | None = None
    busy: float | None = None
    skipped = [0]
    async with rollouts(where.backend, env, rollout_plan, serve) as backend_:
        meta = {
            "env": env.name, "model": backend_.model, "upstream": backend_.upstream, "n": n,
            "runtime": _runtime_name(env),
            "r": r, "seed": seed, "sampling": {**env.sampling, **sampling},
            "concurrency": concurrency, "backend": where.backend,
        }
        run = await _open_run(out_path, resume, meta)
        run_key = str(run.meta.get("name") or out_path.name)
        try:
            done = set(run.completed_pairs()) if resume else set()
            count = await asyncio.to_thread(env.count)
            if total_hint is not None:
                total = None if count is None else min(count, n if n is not None else count)
                total_hint(None if total is None else total * r - len(done))
            work = _work(env.take(n), r, done, skipped)
            async with LoopLagProbe() as probe:
                try:
                    status = await _drive(
                        backend_, run, env.name, run_key, work, concurrency, stop,
                        tally, on_episode,
                    )
                except BaseException:
                    status = RunStatus.INTERRUPTED
                    raise
                finally:
                    lag, busy = probe.p99_ms, probe.busy
        finally:
            await run.close(status=status)
    summary = tally.summary(
        env=env.name, model=backend_.model, status=status, run_dir=str(out_path),
        loop_lag_p99_ms=lag, skipped=skipped[0], loop_busy=busy,
    )
    # Hand back the run opened for reading (the writer is closed).
    reader = await asyncio.to_thread(open_run, out_path)
    reason = None
    if tally.n and tally.calls_ok == 0 and tally.first_error is not None:
        reason = f"no rollout got a model answer (first error: {tally.first_error})"
    return EvalResult(run=reader, summary=summary, status=status, reason=reason)


def _runtime_name(env: Environment) -> str | None:
    # Recorded in the run's meta: the runtime's name, or a custom factory's own name.
    chosen = getattr(env.harness, "runtime", None)
    if chosen is None or isinstance(chosen, str):
        return chosen
    name = getattr(chosen, "name", None) or getattr(chosen, "__qualname__", None)
    return str(name or type(chosen).__name__)


async def _drive(
    backend: Rollouts,
    run: RunWriter,
    env_name: str,
    run_key: str,
    work: Iterator[tuple[Task, int]],
    concurrency: int,
    stop: asyncio.Event | None,
    tally: Tally,
    on_episode: EpisodeCallback | None,
) -> RunStatus:
    """Run the work with ``concurrency`` workers until done (``complete``) or ``stop`` is
    set (``interrupted``); a store failure ends the eval by raising."""

    async def one(task: Task, index: int) -> None:
        episode = Episode(
            env=env_name, task_key=task.key, task=dict(task.data),
            group_id=_group_id(run_key, task.key), group_index=index, run=run_key,
        )
        episode = await backend.rollout(run, task, episode)
        tally.add(episode)
        if on_episode is not None:
            on_episode(episode, tally)

    async def worker() -> None:
        for task, index in work:
            await one(task, index)

    workers = [asyncio.create_task(worker()) for _ in range(concurrency)]
    waiter = asyncio.create_task(stop.wait()) if stop is not None else None
    try:
        pending: set[asyncio.Future[Any]] = set(workers)
        while pending:
            waits = pending | ({waiter} if waiter is not None else set())
            finished, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            if waiter is not None and waiter in finished:
                return RunStatus.INTERRUPTED
            for f in finished:
                pending.discard(f)
                f.result()
        return RunStatus.COMPLETE
    finally:
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        if waiter is not None:
            waiter.cancel()
