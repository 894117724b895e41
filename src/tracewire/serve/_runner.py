"""The runner interface workers call, the stand-in runner, and loading runner factories.

A *runner* is ``async runner(task, episode) -> None``: it fills the episode's traces and calls
``trace.notify()`` as turns commit; the worker streams whatever appears. A *runner factory*
is ``factory(env, options)`` returning an async context manager that yields a runner (so a
factory can start a model server and a proxy once per worker and stop them at the end).
A worker process cannot be handed a function, so a factory travels as its reference
``"module:attribute"`` (:func:`factory_ref`, what pickle would do): a caller passes the
function and serve names it; serve never names a factory of a part above it.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import numpy as np

from .._errors import EnvError
from ..trace import Call, Endpoint, Episode, Message, Node, Span, StopReason

__all__ = [
    "Runner",
    "RunnerFactory",
    "factory_ref",
    "load_factory",
    "standin_factory",
    "standin_runner",
]

#: Fills ``episode`` for ``task``; calls ``trace.notify()`` as turns commit.
Runner = Callable[[dict[str, Any], Episode], Awaitable[None]]
#: ``factory(env, options)`` -> async context manager yielding a :data:`Runner`.
RunnerFactory = Callable[[str, dict[str, Any]], contextlib.AbstractAsyncContextManager[Runner]]

#: Longest stretch of turns the stand-in runs without yielding when it has no delay.
YIELD_S = 0.0005


def standin_runner(turns: int = 10, tokens: int = 1000, delay: float = 0.0) -> Runner:
    """A runner with no model: ``turns`` turns of ``tokens`` sampled tokens each.

    A task may override ``turns``, ``tokens`` and ``delay`` (seconds between turns). Each turn
    appends a user node (8 prompt tokens) and an assistant node (``tokens`` tokens, mask 1,
    logprobs), one ``Call``, then notifies; the transport is what gets measured. With no
    delay it yields to the event loop whenever :data:`YIELD_S` of work has passed (a real
    harness awaits its model between turns; the stand-in has nothing to wait for).
    """
    cache: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def arrays(k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        # One turn's columns: 8 prompt tokens (mask 0, no logprobs), then k sampled ones.
        if k not in cache:
            rng = np.random.default_rng(k)
            ids = np.concatenate([np.arange(8, dtype=np.int32),
                                  rng.integers(0, 150_000, k, dtype=np.int32)])
            mask = np.concatenate([np.zeros(8, np.uint8), np.ones(k, np.uint8)])
            lps = np.concatenate([np.full(8, np.nan, np.float32),
                                  -rng.random(k, dtype=np.float32)])
            cache[k] = (ids, mask, lps)
        return cache[k]

    async def run(task: dict[str, Any], episode: Episode) -> None:
        n = int(task.get("turns", turns))
        k = int(task.get("tokens", tokens))
        pause = float(task.get("delay", delay))
        ids, mask, lps = arrays(k)
        now = time.time()
        episode.timing["agent"] = Span(start=now)
        trace = episode.new_trace(agent={"name": "standin"})
        # The stand-in knows its budget (a real runner may know max turns x max tokens).
        trace.columns.reserve(n * (k + 8))
        usage = {"prompt_tokens": 8, "completion_tokens": k}
        # Bound methods and lists fetched once: the loop body is what a turn costs.
        append, nodes, calls, notify = trace.columns.append, trace.nodes, trace.calls, trace.notify
        clock = time.perf_counter
        next_yield = clock() + YIELD_S
        parent: int | None = None
        for turn in range(n):
            # Both nodes' tokens in one append (the runner owns its append-only trace).
            start, end = append(ids, mask, lps)
            user = len(nodes)
            nodes.append(Node(parent=parent, message=Message(role="user",
                              content=f"turn {turn}"), ts=now, start=start, end=start + 8))
            nodes.append(Node(parent=user, message=Message(role="assistant",
                              content=f"answer {turn}"), sampled=True, ts=now,
                              start=start + 8, end=end))
            parent = user + 1
            calls.append(Call(model="standin", endpoint=Endpoint.CHAT, finish_reason="stop",
                              usage=usage, node=parent, prompt_node=user))
            notify()
            if pause:
                await asyncio.sleep(pause)  # a real harness waits on the model here
            elif clock() >= next_yield:
                await asyncio.sleep(0)  # let the worker stream; keeps loop stalls short
                next_yield = clock() + YIELD_S
        trace.stop = StopReason.MAX_TURNS
        trace.completed = True
        trace.set_reward("standin", 1.0)
        episode.timing["agent"] = Span(start=now, end=time.time())
        trace.notify()

    return run


@contextlib.asynccontextmanager
async def standin_factory(env: str, options: dict[str, Any]) -> AsyncIterator[Runner]:
    """Factory of :func:`standin_runner`; options ``turns``, ``tokens``, ``delay``.

    ``fail_start`` makes the worker fail at start-up (to exercise the pool's failure paths).
    """
    if options.get("fail_start"):
        raise EnvError(f"stand-in environment {env!r} told to fail at start-up")
    yield standin_runner(int(options.get("turns", 10)), int(options.get("tokens", 1000)),
                         float(options.get("delay", 0.0)))


def load_factory(spec: str) -> RunnerFactory:
    """Import a runner factory named ``"module:attribute"``; raises ``EnvError``."""
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise EnvError(f"runner factory {spec!r} is not of the form 'module:attribute'")
    try:
        obj = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise EnvError(f"cannot load runner factory {spec!r}: {exc}") from exc
    if not callable(obj):
        raise EnvError(f"runner factory {spec!r} is not callable")
    return obj  # type: ignore[no-any-return]


def factory_ref(factory: RunnerFactory | str) -> str:
    """The ``"module:attribute"`` a worker process loads ``factory`` by (a string is
    checked and kept); raises ``EnvError`` when it is not importable under its own name
    (a lambda, a closure, a method), so that fails here rather than in every worker."""
    if isinstance(factory, str):
        if not factory.partition(":")[2]:
            raise EnvError(f"runner factory {factory!r} is not of the form 'module:attribute'")
        return factory
    module = getattr(factory, "__module__", None)
    name = getattr(factory, "__qualname__", None)
    ref = f"{module}:{name}"
    if not module or not name or "<" in name or "." in name:
        raise EnvError(f"runner factory {factory!r} has no importable name; define it at "
                       "module level")
    if load_factory(ref) is not factory:
        raise EnvError(f"runner factory {ref!r} does not load back as the object given")
    return ref
