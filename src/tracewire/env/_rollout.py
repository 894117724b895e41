"""The rollout lifecycle: boot → setup → agent → finalize → scoring, each timed and bounded.

A phase that raises or runs past its deadline becomes the trace's stop condition
(``<phase>_timeout`` / ``<phase>_error``) and an error on the trace; the rollout goes on to
the phases that still make sense (finalize after a started setup, scoring after boot) and
``run_rollout`` returns normally. Only cancellation propagates.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from .._errors import PhaseTimeout
from ..trace import Episode, InfoKey, Span, StopReason, Trace
from ._api import Environment, Task, Timeouts, as_task, call_user
from ._context import Rollout, http_client
from ._session import ProxyLike, SessionLike

__all__ = ["PHASES", "rollout_seed", "run_rollout"]

#: Phases in the order they run.
PHASES = ("boot", "setup", "agent", "finalize", "scoring")


def rollout_seed(seed: int, task_key: str, index: int) -> int:
    """A stable per-rollout sampling seed derived from the run seed, task and rollout index."""
    h = hashlib.blake2b(f"{seed}/{task_key}/{index}".encode(), digest_size=4).digest()
    return int.from_bytes(h, "little") & 0x7FFFFFFF


class _Attempt:
    """One attempt at a rollout: owns its trace and remembers the first failure."""

    def __init__(self, trace: Trace, timeouts: Timeouts) -> None:
        self.trace = trace
        self.timeouts = timeouts
        self.failure: BaseException | None = None

    async def phase(self, name: str, body: Callable[[], Awaitable[None]]) -> bool:
        """Run one phase; returns False when it failed (error recorded, stop set)."""
        trace = self.trace
        span = Span(start=time.time())
        trace.timing[name] = span
        trace.info["phase"] = name
        trace.notify()
        deadline = self.timeouts.of(name)
        ok = False
        try:
            cm = asyncio.timeout(deadline)
            try:
                async with cm:
                    await body()
            except TimeoutError as exc:
                if not cm.expired():
                    raise
                err = PhaseTimeout(f"{name} phase ran past its {deadline:g} s deadline")
                err.__cause__ = exc
                self._fail(name, err, timed_out=True)
            else:
                ok = True
        except asyncio.CancelledError:
            span.end = time.time()
            trace.notify()
            raise
        except Exception as exc:
            self._fail(name, exc, timed_out=False)
        span.end = time.time()
        trace.notify()
        return ok

    def _fail(self, phase: str, exc: BaseException, *, timed_out: bool) -> None:
        trace = self.trace
        trace.add_error(type(exc).__name__, str(exc) or repr(exc), phase)
        if trace.stop is None:
            trace.stop = StopReason.failed(phase, timed_out)
        if self.failure is None:
            self.failure = exc


def _retryable(exc: BaseException | None, retry_on: Sequence[type[BaseException] | str]) -> bool:
    if exc is None:
        return False
    for kind in retry_on:
        if isinstance(kind, str):
            if any(c.__name__ == kind for c in type(exc).__mro__):
                return True
        elif isinstance(exc, kind):
            return True
    return False


async def _score(env: Environment, task: Task, trace: Trace) -> None:
    # Each function's failure is recorded on its own so one bad metric costs only itself;
    # the phase fails (scoring_error) if any did.
    failed: list[BaseException] = []
    for scorer in env.rewards:
        try:
            value = float(await call_user(scorer.fn, task, trace))
        except Exception as exc:
            failed.append(exc)
            trace.add_error(type(exc).__name__, f"reward {scorer.name}: {exc}", "scoring")
            value = 0.0
        trace.set_reward(scorer.name, value if math.isfinite(value) else 0.0, scorer.weight)
    for metric in env.metrics:
        try:
            trace.metrics[metric.name] = float(await call_user(metric.fn, task, trace))
        except Exception as exc:
            failed.append(exc)
            trace.add_error(type(exc).__name__, f"metric {metric.name}: {exc}", "scoring")
    if failed:
        # Already recorded above; re-raise the first so the phase is marked failed.
        raise _Recorded(failed[0])


class _Recorded(Exception):
    """Wraps a scoring failure that is already on the trace."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(str(exc))
        self.exc = exc


async def _attempt(
    env: Environment,
    task: Task,
    episode: Episode,
    proxy: ProxyLike,
    *,
    model: str,
    sampling: dict[str, Any],
    timeouts: Timeouts,
    attempt: int,
    on_trace: Callable[[Trace], None] | None,
) -> _Attempt:
    trace = episode.new_trace(
        agent={"env": env.name, "harness": env.harness.kind, "model": model}
    )
    if attempt:
        trace.info["attempt"] = attempt
    if on_trace is not None:
        on_trace(trace)
    a = _Attempt(trace, timeouts)
    rollout: Rollout | None = None

    async def boot() -> None:
        nonlocal rollout
        session: SessionLike = proxy.create_session(
            trace=trace,
            metadata={"env": env.name, "task_key": task.key, "episode": episode.id},
            group_id=episode.group_id,
            group_index=episode.group_index,
        )
        trace.info["session"] = session.id
        rollout = Rollout(
            env=env, task=task, episode=episode, trace=trace, session=session,
            model=model, sampling=sampling,
        )
        if env.harness.uses_sdk:
            rollout.http = await http_client()
        await env.harness.boot(rollout)

    async def setup() -> None:
        assert rollout is not None
        await env.setup(task, rollout)

    async def agent() -> None:
        assert rollout is not None
        await env.harness.run(rollout)

    async def finalize() -> None:
        assert rollout is not None
        await env.finalize(task, rollout)

    async def scoring() -> None:
        try:
            await _score(env, task, trace)
        except _Recorded as rec:
            if trace.stop is None:
                trace.stop = StopReason.SCORING_ERROR
            if a.failure is None:
                a.failure = rec.exc

    try:
        if await a.phase("boot", boot):
            if await a.phase("setup", setup):
                await a.phase("agent", agent)
            await a.phase("finalize", finalize)
        await a.phase("scoring", scoring)
    finally:
        if rollout is not None:
            if trace.stop is None:
                trace.stop = rollout.stop_reason or StopReason.DONE
            await _cleanup(env, rollout, proxy)
        elif trace.stop is None:
            trace.stop = StopReason.DONE
    trace.info.pop("phase", None)
    return a


async def _cleanup(env: Environment, rollout: Rollout, proxy: ProxyLike) -> None:
    await rollout.aclose()
    await env.harness.cleanup(rollout)
    finish = getattr(proxy, "finish_session", None)
    if finish is not None:  # token-in/token-out records its mismatch report on the trace
        try:
            await finish(rollout.session.id)
        except LookupError:
            pass
        figures = [t.info[InfoKey.TITO_MISMATCH] for t in rollout.episode.traces
                   if isinstance(t.info.get(InfoKey.TITO_MISMATCH), int)]
        if figures:  # the index column tito_mismatch reads it from episode.info
            rollout.episode.info[InfoKey.TITO_MISMATCH] = sum(figures)
    try:
        proxy.registry.delete(rollout.session.id)
    except LookupError:
        pass  # already expired or deleted


async def run_rollout(
    env: Environment,
    task: Task | Mapping[str, Any],
    *,
    proxy: ProxyLike,
    episode: Episode,
    model: str,
    timeouts: Timeouts | None = None,
    sampling: Mapping[str, Any] | None = None,
    seed: int | None = None,
    retries: int | None = None,
    on_trace: Callable[[Trace], None] | None = None,
) -> Episode:
    """Run one rollout of ``task`` into ``episode`` (its first trace) through ``proxy``,
    asking for ``model`` (the name the proxy's upstream serves).

    Never raises for rollout failures: they are recorded on the trace (stop condition,
    errors). Retries the whole rollout up to ``retries`` times (default ``env.retries``) when
    the failure is one of ``env.retry_on``; an abandoned attempt's trace is removed.
    ``on_trace(trace)`` is called when an attempt's trace is created (e.g. to journal it).
    """
    task = as_task(task, 0)
    if not episode.env:
        episode.env = env.name
    if not episode.task_key:
        episode.task_key = task.key
    if not episode.task:
        episode.task = dict(task.data)
    params = {**env.sampling, **(sampling or {})}
    if seed is not None and "seed" not in params:
        params["seed"] = rollout_seed(seed, task.key, episode.group_index)
    limit = env.retries if retries is None else retries
    started = time.time()
    episode.timing["rollout"] = Span(start=started)
    attempt = 0
    while True:
        a = await _attempt(
            env, task, episode, proxy, model=model, sampling=params,
            timeouts=timeouts or env.timeouts, attempt=attempt, on_trace=on_trace,
        )
        if attempt < limit and _retryable(a.failure, env.retry_on):
            attempt += 1
            episode.traces.remove(a.trace)
            episode.info["retries"] = attempt
            continue
        break
    trace = a.trace
    trace.completed = True
    episode.ok = trace.ok
    episode.timing["rollout"].end = time.time()
    trace.notify()
    return episode
