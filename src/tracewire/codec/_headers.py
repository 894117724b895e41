"""Wire/disk headers for episodes and traces, and conversion to and from the live objects.

A header is everything but the token memory; columns appear as array fields that the
array hooks turn into separate buffers. Conversion shares references (no copies): encoding
a trace builds one small Struct around its existing lists and array views.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
import numpy as np

from ..trace import (
    EPISODE_FIELDS,
    SCHEMA_VERSION,
    Call,
    Columns,
    Episode,
    ErrorInfo,
    Node,
    Reward,
    Span,
    Trace,
)

__all__ = [
    "EPISODE_FIELDS",
    "EpisodeFields",
    "EpisodeHeader",
    "Pack",
    "TraceHeader",
    "episode_fields",
    "episode_from_header",
    "episode_header",
    "set_episode_fields",
    "trace_from_header",
    "trace_header",
    "validate_trace",
]


class TraceHeader(msgspec.Struct, tag="trace", kw_only=True, omit_defaults=True):
    """A whole trace: its fields plus its columns (as buffer references)."""

    id: str
    schema: int = SCHEMA_VERSION
    agent: dict[str, Any] = msgspec.field(default_factory=dict)
    nodes: list[Node] = msgspec.field(default_factory=list)
    calls: list[Call] = msgspec.field(default_factory=list)
    errors: list[ErrorInfo] = msgspec.field(default_factory=list)
    timing: dict[str, Span] = msgspec.field(default_factory=dict)
    rewards: dict[str, Reward] = msgspec.field(default_factory=dict)
    metrics: dict[str, float] = msgspec.field(default_factory=dict)
    info: dict[str, Any] = msgspec.field(default_factory=dict)
    stop: str | None = None
    completed: bool = False
    ok: bool = True
    columns: dict[str, np.ndarray] = msgspec.field(default_factory=dict)


class EpisodeFields(msgspec.Struct, kw_only=True, omit_defaults=True):
    """An episode's own fields (``tracewire.trace.EPISODE_FIELDS``, with their wire types):
    the base of the stored header and of a delta's head."""

    id: str
    env: str = ""
    task_key: str = ""
    task: dict[str, Any] = msgspec.field(default_factory=dict)
    group_id: str | None = None
    group_index: int = 0
    run: str = ""
    ok: bool = True
    errors: list[ErrorInfo] = msgspec.field(default_factory=list)
    timing: dict[str, Span] = msgspec.field(default_factory=dict)
    info: dict[str, Any] = msgspec.field(default_factory=dict)


if EpisodeFields.__struct_fields__ != EPISODE_FIELDS:  # one declaration, checked on import
    raise ImportError(
        f"codec EpisodeFields {EpisodeFields.__struct_fields__} != trace EPISODE_FIELDS "
        f"{EPISODE_FIELDS}"
    )


class EpisodeHeader(EpisodeFields, tag="episode", kw_only=True, omit_defaults=True):
    """A whole episode: its own fields, the schema it was written with, and its traces.

    ``schema`` follows the own fields on the wire; fields are keyed by name (a map), and a
    default ``schema`` is omitted, so the bytes are the same as with any field order.
    """

    schema: int = SCHEMA_VERSION
    traces: list[TraceHeader] = msgspec.field(default_factory=list)


#: Optional transform of a trace's long lists before encoding (e.g. pre-encode in slices).
Pack = Callable[[list[Any]], Any]


def _same(items: list[Any]) -> Any:
    return items


def trace_header(t: Trace, pack: Pack = _same) -> TraceHeader:
    """Header of a live trace (shares its lists and column views)."""
    return TraceHeader(
        id=t.id,
        schema=t.schema,
        agent=t.agent,
        nodes=pack(t.nodes),
        calls=pack(t.calls),
        errors=pack(t.errors),
        timing=t.timing,
        rewards=t.rewards,
        metrics=t.metrics,
        info=t.info,
        stop=t.stop,
        completed=t.completed,
        ok=t.ok,
        columns=t.columns.arrays(),
    )


def validate_trace(nodes: list[Node], calls: list[Call], n_tokens: int, base: int = 0) -> None:
    """Check graph and slice invariants of nodes appended after ``base`` existing nodes.

    Raises ``ValueError`` naming the first broken invariant.
    """
    for k, node in enumerate(nodes, start=base):
        p = node.parent
        if p is not None and not 0 <= p < k:
            raise ValueError(f"node {k} has parent {p}, which is not an earlier node")
        if not 0 <= node.start <= node.end <= n_tokens:
            raise ValueError(f"node {k} slice [{node.start}, {node.end}) outside 0..{n_tokens}")
        for link in node.links:
            if link.target < 0:
                raise ValueError(f"node {k} links to negative node {link.target}")
    total = base + len(nodes)
    for j, call in enumerate(calls):
        for ref in (call.node, call.prompt_node):
            if ref is not None and not 0 <= ref < total:
                raise ValueError(f"call {j} refers to missing node {ref}")


def trace_from_header(h: TraceHeader) -> Trace:
    """Rebuild a live trace from a decoded header (columns adopted without copying)."""
    columns = Columns.from_arrays(h.columns) if h.columns else Columns()
    validate_trace(h.nodes, h.calls, len(columns))
    t = Trace(h.id, agent=h.agent, columns=columns)
    t.schema = h.schema
    t.nodes = h.nodes
    t.calls = h.calls
    t.errors = h.errors
    t.timing = h.timing
    t.rewards = h.rewards
    t.metrics = h.metrics
    t.info = h.info
    t.stop = h.stop
    t.completed = h.completed
    t.ok = h.ok
    return t


def episode_fields(e: Episode) -> dict[str, Any]:
    """The episode's own fields by name (shared references)."""
    return {f: getattr(e, f) for f in EPISODE_FIELDS}


def set_episode_fields(e: Episode, src: Any) -> None:
    """Copy the episode's own fields (except ``id``) from a header or delta head."""
    for f in EPISODE_FIELDS[1:]:
        setattr(e, f, getattr(src, f))


def episode_header(e: Episode, pack: Pack = _same) -> EpisodeHeader:
    """Header of a live episode and all its traces."""
    return EpisodeHeader(**episode_fields(e), traces=[trace_header(t, pack) for t in e.traces])


def episode_from_header(h: EpisodeHeader) -> Episode:
    """Rebuild a live episode from a decoded header."""
    e = Episode(h.id, traces=[trace_from_header(t) for t in h.traces])
    set_episode_fields(e, h)
    return e
