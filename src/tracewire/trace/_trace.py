"""Trace and Episode: append-only records of what an agent did, with token columns.

A trace's nodes, calls and errors are only ever appended; tokens are only ever appended to
its :class:`Columns`; a handful of scalar fields (timing, rewards, metrics, info, stop,
completed, ok, agent) are set. Deltas, persistence and samples all rely on that.
"""

from __future__ import annotations

import logging
import time
import uuid
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ._branch import Branch
from ._columns import Columns
from ._model import SCHEMA_VERSION, Call, ErrorInfo, Link, Message, Node, Reward, Span

__all__ = ["EPISODE_FIELDS", "SCALAR_FIELDS", "Episode", "Trace", "Watcher", "new_id"]

log = logging.getLogger("tracewire.trace")

#: Callback given to :meth:`Trace.watch`; called with the trace after each ``notify()``.
Watcher = Callable[["Trace"], None]

#: Trace fields that are set rather than appended; deltas carry them when they change.
SCALAR_FIELDS = ("agent", "timing", "rewards", "metrics", "info", "stop", "completed", "ok")

#: An episode's own fields (all but its traces), in their wire order. Declared only here:
#: the codec's header and delta head Structs are checked against it when imported, and the
#: store's index rows are computed from a subset of it.
EPISODE_FIELDS = ("id", "env", "task_key", "task", "group_id", "group_index", "run", "ok",
                  "errors", "timing", "info")


_TOKENS_DEPRECATED = "Trace.tokens is now Trace.columns; the old name goes in the next release"


def new_id() -> str:
    """A fresh random id (32 hex characters)."""
    return uuid.uuid4().hex


class Trace:
    """One agent's record within an episode: message graph, calls, errors and token columns."""

    __slots__ = (
        "_watchers",
        "agent",
        "calls",
        "columns",
        "completed",
        "errors",
        "id",
        "info",
        "metrics",
        "nodes",
        "ok",
        "pending",
        "rewards",
        "schema",
        "stop",
        "timing",
    )

    def __init__(
        self,
        id: str | None = None,
        *,
        agent: dict[str, Any] | None = None,
        columns: Columns | None = None,
        tokens: Columns | None = None,
    ) -> None:
        if tokens is not None:
            warnings.warn(_TOKENS_DEPRECATED, DeprecationWarning, stacklevel=2)
            if columns is None:
                columns = tokens
        self.id: str = id or new_id()
        self.schema: int = SCHEMA_VERSION
        self.agent: dict[str, Any] = agent or {}
        self.nodes: list[Node] = []
        self.calls: list[Call] = []
        self.errors: list[ErrorInfo] = []
        self.timing: dict[str, Span] = {}
        self.rewards: dict[str, Reward] = {}
        self.metrics: dict[str, float] = {}
        self.info: dict[str, Any] = {}
        self.stop: str | None = None
        self.completed: bool = False
        self.ok: bool = True
        self.columns: Columns = columns if columns is not None else Columns()
        #: Messages of the request in flight that no node holds yet; streamed, never stored.
        self.pending: list[Message] = []
        self._watchers: list[Watcher] = []

    def __repr__(self) -> str:
        return (
            f"Trace(id={self.id!r}, nodes={len(self.nodes)}, tokens={len(self.columns)}, "
            f"calls={len(self.calls)}, stop={self.stop!r})"
        )

    @property
    def tokens(self) -> Columns:
        """Deprecated name of :attr:`columns` (kept for one release)."""
        warnings.warn(_TOKENS_DEPRECATED, DeprecationWarning, stacklevel=2)
        return self.columns

    @tokens.setter
    def tokens(self, columns: Columns) -> None:
        warnings.warn(_TOKENS_DEPRECATED, DeprecationWarning, stacklevel=2)
        self.columns = columns

    # -- appends -----------------------------------------------------------------------
    def add_node(
        self,
        message: Message,
        *,
        parent: int | None = None,
        sampled: bool = False,
        ids: ArrayLike | None = None,
        mask: ArrayLike | int | None = None,
        logprobs: ArrayLike | None = None,
        extra: Mapping[str, ArrayLike] | None = None,
        links: Iterable[Link] = (),
        ts: float | None = None,
        has_tokens: bool = True,
        digest: str = "",
    ) -> int:
        """Append a node (and its tokens, if any) and return its index.

        ``mask`` defaults to 1 for sampled nodes and 0 otherwise.
        """
        if parent is not None and not 0 <= parent < len(self.nodes):
            raise IndexError(f"parent {parent} is not a node of this trace")
        if ids is not None:
            m = (1 if sampled else 0) if mask is None else mask
            start, end = self.columns.append(ids, m, logprobs, extra)
        else:
            start = end = len(self.columns)
        node = Node(
            parent=parent,
            message=message,
            sampled=sampled,
            ts=time.time() if ts is None else ts,
            start=start,
            end=end,
            links=tuple(links),
            has_tokens=has_tokens,
            digest=digest,
        )
        self.nodes.append(node)
        return len(self.nodes) - 1

    def add_call(self, call: Call) -> int:
        """Append a finished model call and return its index."""
        self.calls.append(call)
        return len(self.calls) - 1

    def add_error(self, type: str, message: str = "", phase: str | None = None) -> ErrorInfo:
        """Record an error; it also marks the trace not ok."""
        err = ErrorInfo(type=type, message=message, phase=phase, ts=time.time())
        self.errors.append(err)
        self.ok = False
        return err

    def set_reward(self, name: str, score: float, weight: float = 1.0) -> None:
        """Set one named reward."""
        self.rewards[name] = Reward(score=float(score), weight=float(weight))

    @property
    def reward(self) -> float:
        """Weighted sum of the rewards (0.0 when there are none)."""
        return float(sum(r.score * r.weight for r in self.rewards.values()))

    # -- graph ---------------------------------------------------------------------------
    def path(self, leaf: int) -> list[int]:
        """Node indices from the root to ``leaf``, inclusive."""
        out: list[int] = []
        i: int | None = leaf
        while i is not None:
            out.append(i)
            i = self.nodes[i].parent
        out.reverse()
        return out

    def leaves(self) -> list[int]:
        """Indices of nodes with no children, in creation order."""
        has_child = np.zeros(len(self.nodes), dtype=bool)
        for node in self.nodes:
            if node.parent is not None:
                has_child[node.parent] = True
        return [int(i) for i in np.flatnonzero(~has_child)]

    def branch(self, leaf: int | None = None) -> Branch:
        """The root-to-leaf view ending at ``leaf`` (default: the last node)."""
        if leaf is None:
            leaf = len(self.nodes) - 1
        return Branch(self, self.path(leaf) if leaf >= 0 else [])

    def branches(self) -> list[Branch]:
        """One branch per leaf."""
        return [self.branch(leaf) for leaf in self.leaves()]

    def node_tokens(self, index: int) -> dict[str, NDArray[Any]]:
        """The columns of node ``index``'s own slice (views)."""
        node = self.nodes[index]
        return self.columns.slice(node.start, node.end)

    # -- change notification -----------------------------------------------------------
    def watch(self, callback: Watcher) -> Callable[[], None]:
        """Call ``callback(trace)`` on every ``notify()``; returns a function that unsubscribes."""
        self._watchers.append(callback)

        def unwatch() -> None:
            if callback in self._watchers:
                self._watchers.remove(callback)

        return unwatch

    def notify(self) -> None:
        """Tell watchers the trace changed. A failing watcher is logged, never propagated."""
        for cb in list(self._watchers):
            try:
                cb(self)
            except Exception:
                log.exception("trace watcher %r failed", cb)

    def set_pending(self, messages: list[Message]) -> None:
        """Preview the messages a request in flight adds, then notify watchers."""
        self.pending = list(messages)
        self.notify()


class Episode:
    """One rollout of one task: its traces plus identity, grouping, timing and errors."""

    __slots__ = (*EPISODE_FIELDS, "traces")

    def __init__(
        self,
        id: str | None = None,
        *,
        env: str = "",
        task_key: str = "",
        task: dict[str, Any] | None = None,
        group_id: str | None = None,
        group_index: int = 0,
        run: str = "",
        traces: list[Trace] | None = None,
    ) -> None:
        self.id: str = id or new_id()
        self.env = env
        self.task_key = task_key
        self.task: dict[str, Any] = task or {}
        self.group_id = group_id
        self.group_index = group_index
        self.run = run
        self.ok: bool = True
        self.errors: list[ErrorInfo] = []
        self.traces: list[Trace] = traces if traces is not None else []
        self.timing: dict[str, Span] = {}
        self.info: dict[str, Any] = {}

    def __repr__(self) -> str:
        return (
            f"Episode(id={self.id!r}, env={self.env!r}, task_key={self.task_key!r}, "
            f"traces={len(self.traces)})"
        )

    def new_trace(self, **kwargs: Any) -> Trace:
        """Create, attach and return a new trace."""
        trace = Trace(**kwargs)
        self.traces.append(trace)
        return trace

    def add_error(self, type: str, message: str = "", phase: str | None = None) -> ErrorInfo:
        """Record an episode-level error; it also marks the episode not ok."""
        err = ErrorInfo(type=type, message=message, phase=phase, ts=time.time())
        self.errors.append(err)
        self.ok = False
        return err

    @property
    def reward(self) -> float:
        """Total reward of the first trace (the main agent), 0.0 if none."""
        return self.traces[0].reward if self.traces else 0.0
