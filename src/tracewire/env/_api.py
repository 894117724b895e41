"""The environment API: tasks, scoring functions, phase timeouts.

An :class:`Environment` is a plain object: where its tasks come from, which harness drives
the model, how a finished trace is scored, and optional per-task ``setup``/``finalize``.
Scoring functions, ``setup`` and ``finalize`` may be sync or async; sync ones run in a
worker thread so they never stall the event loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import itertools
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence, Sized
from dataclasses import dataclass
from typing import Any, TypeAlias

from .._errors import EnvError
from ..trace import Trace
from ._context import Rollout
from ._harness import Harness
from ._task import Task, as_task

__all__ = [
    "Environment",
    "Metric",
    "RewardFn",
    "Scorer",
    "Task",
    "Timeouts",
    "as_task",
    "call_user",
]

#: A reward or metric: ``fn(task, trace) -> float`` (sync or async).
RewardFn: TypeAlias = Callable[["Task", Trace], "float | Awaitable[float]"]
Metric = RewardFn
#: Per-task hook: ``fn(task, rollout)`` (sync or async); runs in the setup/finalize phase.
Hook: TypeAlias = Callable[["Task", "Rollout"], "Awaitable[None] | None"]


@dataclass(frozen=True)
class Timeouts:
    """Deadline of each rollout phase in seconds (``None``: no deadline)."""

    boot: float | None = 60.0
    setup: float | None = 60.0
    agent: float | None = 600.0
    finalize: float | None = 60.0
    scoring: float | None = 60.0

    def replace(self, **changes: float | None) -> Timeouts:
        """A copy with some deadlines changed."""
        return dataclasses.replace(self, **changes)

    def of(self, phase: str) -> float | None:
        """The deadline of ``phase``."""
        value: float | None = getattr(self, phase)
        return value


@dataclass(frozen=True)
class Scorer:
    """A named, weighted reward function (plain functions get their ``__name__`` and 1.0)."""

    fn: RewardFn
    name: str = ""
    weight: float = 1.0

    @staticmethod
    def of(item: Scorer | RewardFn | tuple[RewardFn, float]) -> Scorer:
        """Normalize a function, a ``(function, weight)`` pair or a Scorer."""
        if isinstance(item, Scorer):
            return item if item.name else dataclasses.replace(item, name=_name_of(item.fn))
        if isinstance(item, tuple):
            fn, weight = item
            return Scorer(fn, _name_of(fn), float(weight))
        if callable(item):
            return Scorer(item, _name_of(item))
        raise EnvError(f"not a reward or metric function: {item!r}")


def _name_of(fn: Callable[..., Any]) -> str:
    return str(getattr(fn, "__name__", type(fn).__name__))


TaskRows: TypeAlias = "Iterable[Task | Mapping[str, Any]]"
#: Task rows, or a zero-argument callable producing them.
TaskSource: TypeAlias = "TaskRows | Callable[[], TaskRows]"


class Environment:
    """Tasks + harness + scoring. Subclass it or pass everything to the constructor.

    ``tasks`` is an iterable of task rows or a zero-argument callable returning one (so a
    large or generated task set is produced lazily, and again on every eval).
    """

    def __init__(
        self,
        name: str,
        *,
        tasks: TaskSource = (),
        harness: Harness,
        rewards: Sequence[Scorer | RewardFn | tuple[RewardFn, float]] = (),
        metrics: Sequence[Scorer | RewardFn] = (),
        setup: Hook | None = None,
        finalize: Hook | None = None,
        timeouts: Timeouts | None = None,
        sampling: Mapping[str, Any] | None = None,
        retries: int = 0,
        retry_on: Sequence[type[BaseException] | str] = (),
        description: str = "",
    ) -> None:
        if not isinstance(harness, Harness):
            raise EnvError(f"{name}: the harness is a {type(harness).__name__}, not a "
                           "tracewire.env.Harness (subclass it)")
        self.name = name
        self.harness = harness
        self.rewards = [Scorer.of(r) for r in rewards]
        self.metrics = [Scorer.of(m) for m in metrics]
        self.timeouts = timeouts or Timeouts()
        self.sampling: dict[str, Any] = dict(sampling or {})
        self.retries = retries
        self.retry_on = tuple(retry_on)
        self.description = description
        #: The reference :func:`load_environment` found it by (a bundled name, a module or a
        #: ``.py`` path), so processes that must load it themselves can; None when built here.
        self.ref: str | None = None
        self._tasks = tasks
        self._setup = setup
        self._finalize = finalize

    def __repr__(self) -> str:
        return f"Environment({self.name!r}, harness={self.harness.kind!r})"

    def tasks(self) -> Iterator[Task]:
        """The task rows, produced lazily as :class:`Task` objects."""
        src = self._tasks() if callable(self._tasks) else self._tasks
        seen: set[str] = set()
        for i, row in enumerate(src):
            task = as_task(row, i)
            if task.key in seen:
                raise EnvError(f"{self.name}: duplicate task key {task.key!r}")
            seen.add(task.key)
            yield task

    def take(self, n: int | None) -> Iterator[Task]:
        """The first ``n`` tasks (all when ``n`` is None)."""
        return self.tasks() if n is None else itertools.islice(self.tasks(), n)

    def count(self) -> int | None:
        """Number of tasks when known without producing them (a sized source), else None."""
        src = self._tasks
        return len(src) if isinstance(src, Sized) else None

    async def setup(self, task: Task, rollout: Rollout) -> None:
        """Prepare one rollout (the ``setup`` phase); override or pass ``setup=``."""
        if self._setup is not None:
            await call_user(self._setup, task, rollout)

    async def finalize(self, task: Task, rollout: Rollout) -> None:
        """Clean up after the agent (the ``finalize`` phase); override or pass ``finalize=``."""
        if self._finalize is not None:
            await call_user(self._finalize, task, rollout)


async def call_user(fn: Callable[..., Any], *args: Any) -> Any:
    """Call a user function: coroutines are awaited; sync functions run in a thread (and an
    awaitable they return is awaited)."""
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - callable objects with async __call__
    ):
        return await fn(*args)
    result = await asyncio.to_thread(fn, *args)
    if inspect.isawaitable(result):
        result = await result
    return result
