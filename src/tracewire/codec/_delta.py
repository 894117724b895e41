"""Deltas: "everything appended since cursor C, plus changed scalars", and their assembly.

A sender keeps, per trace, the cursor of what the receiver already has (nodes, tokens,
calls, errors) and an encoded snapshot of each scalar field as last sent. Producing a delta
slices the new tail of each list and column (O(new data), never O(all nodes)) and compares
scalar snapshots (O(size of the scalars)). The cursor advances only in ``commit()``, which
the caller runs after the send succeeded, so a failed send is simply produced again.

Every delta carries the cursor it starts from and a per-episode sequence number, so the
receiver detects a lost or reordered delta at once (``DeltaError``). Deltas hold snapshots,
never live references to mutable sender state, and the assembler copies what it keeps, so a
delta handed to a callback is never mutated afterwards.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
from msgspec import UNSET, UnsetType

from .._errors import DeltaError
from ..trace import BASE_COLUMNS, Call, Episode, ErrorInfo, Message, Node, Reward, Span, Trace
from ._headers import EpisodeFields, episode_fields, set_episode_fields, validate_trace

__all__ = [
    "Cursor",
    "EpisodeAssembler",
    "EpisodeDelta",
    "EpisodeHead",
    "EpisodeSender",
    "TraceDelta",
    "TraceSender",
    "cursor_of",
]


class Cursor(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """How much of a trace a receiver holds: counts of nodes, tokens, calls and errors."""

    nodes: int = 0
    tokens: int = 0
    calls: int = 0
    errors: int = 0


def cursor_of(trace: Trace) -> Cursor:
    """The cursor just past everything ``trace`` holds now."""
    return Cursor(len(trace.nodes), len(trace.columns), len(trace.calls), len(trace.errors))


class TraceDelta(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What one trace gained since ``base``; scalar fields are UNSET when unchanged."""

    id: str
    base: Cursor = Cursor()
    reset: bool = False
    nodes: list[Node] = msgspec.field(default_factory=list)
    calls: list[Call] = msgspec.field(default_factory=list)
    errors: list[ErrorInfo] = msgspec.field(default_factory=list)
    columns: dict[str, np.ndarray] = msgspec.field(default_factory=dict)
    agent: dict[str, Any] | UnsetType = UNSET
    timing: dict[str, Span] | UnsetType = UNSET
    rewards: dict[str, Reward] | UnsetType = UNSET
    metrics: dict[str, float] | UnsetType = UNSET
    info: dict[str, Any] | UnsetType = UNSET
    stop: str | UnsetType | None = UNSET
    completed: bool | UnsetType = UNSET
    ok: bool | UnsetType = UNSET
    pending: list[Message] | UnsetType = UNSET

    @property
    def n_tokens(self) -> int:
        """Number of token rows this delta appends."""
        ids = self.columns.get("ids")
        return 0 if ids is None else int(ids.shape[0])

    @property
    def end(self) -> Cursor:
        """The receiver's cursor after applying this delta."""
        b = self.base
        return Cursor(
            b.nodes + len(self.nodes),
            b.tokens + self.n_tokens,
            b.calls + len(self.calls),
            b.errors + len(self.errors),
        )


class EpisodeHead(EpisodeFields, kw_only=True, omit_defaults=True):
    """An episode's own fields (everything but its traces), as a delta carries them."""


class EpisodeDelta(msgspec.Struct, tag="delta", kw_only=True, omit_defaults=True):
    """One step of an episode's stream: changed head, trace deltas, dropped trace ids."""

    episode: str
    seq: int
    head: EpisodeHead | None = None
    traces: list[TraceDelta] = msgspec.field(default_factory=list)
    dropped: list[str] = msgspec.field(default_factory=list)
    final: bool = False


_SCALARS: dict[str, Any] = {
    "agent": dict[str, Any],
    "timing": dict[str, Span],
    "rewards": dict[str, Reward],
    "metrics": dict[str, float],
    "info": dict[str, Any],
    "stop": str | None,
    "completed": bool,
    "ok": bool,
    "pending": list[Message],
}
_IMMUTABLE = {"stop", "completed", "ok"}
_enc = msgspec.msgpack.Encoder()
_decoders = {name: msgspec.msgpack.Decoder(tp) for name, tp in _SCALARS.items()}


class TraceSender:
    """Produces a trace's deltas and remembers what the receiver has."""

    __slots__ = ("_cols", "_last", "_proposed", "_reset", "cursor", "trace")

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self.cursor = Cursor()
        self._last: dict[str, bytes] = {}
        self._cols: list[str] = []  # column names the receiver knows
        self._proposed: tuple[TraceDelta, dict[str, bytes]] | None = None
        self._reset = False

    def discard(self) -> None:
        """Make the next delta tell the receiver to drop this trace and start over."""
        self.cursor = Cursor()
        self._last.clear()
        self._cols = []
        self._reset = True

    def delta(self) -> TraceDelta | None:
        """Everything since the cursor, or None when nothing changed. Does not advance."""
        t, c = self.trace, self.cursor
        fields: dict[str, Any] = {}
        snaps: dict[str, bytes] = {}
        for name in _SCALARS:
            value = getattr(t, name)
            raw = _enc.encode(value)
            if self._last.get(name) != raw:
                snaps[name] = raw
                fields[name] = value if name in _IMMUTABLE else _decoders[name].decode(raw)
        n_tok = len(t.columns)
        # New (even still empty) columns must reach the receiver with their dtype and shape.
        new_cols = t.columns.names() != self._cols
        changed = (
            fields
            or new_cols
            or self._reset
            or len(t.nodes) != c.nodes
            or n_tok != c.tokens
            or len(t.calls) != c.calls
            or len(t.errors) != c.errors
        )
        if not changed:
            self._proposed = None
            return None
        d = TraceDelta(
            id=t.id,
            base=c,
            reset=self._reset,
            nodes=t.nodes[c.nodes :],
            calls=t.calls[c.calls :],
            errors=t.errors[c.errors :],
            columns=t.columns.slice(c.tokens, n_tok) if n_tok != c.tokens or new_cols else {},
            **fields,
        )
        self._proposed = (d, snaps)
        return d

    def commit(self, delta: TraceDelta) -> None:
        """Record that ``delta`` reached the receiver: advance the cursor."""
        if self._proposed is None or self._proposed[0] is not delta:
            raise DeltaError("commit() of a delta that is not the last one produced")
        self.cursor = delta.end
        self._last.update(self._proposed[1])
        if delta.columns:
            self._cols = list(delta.columns)
        self._reset = False
        self._proposed = None


def _head(e: Episode) -> EpisodeHead:
    return EpisodeHead(**episode_fields(e))


_head_dec = msgspec.msgpack.Decoder(EpisodeHead)


class EpisodeSender:
    """Produces an episode's deltas (its head and all its traces) in sequence."""

    def __init__(self, episode: Episode) -> None:
        self.episode = episode
        self.seq = 0
        self._senders: dict[str, TraceSender] = {}
        self._sent_ids: list[str] = []
        self._last_head = b""
        self._proposed: tuple[EpisodeDelta, bytes, list[tuple[TraceSender, TraceDelta]]] | None
        self._proposed = None

    def discard_trace(self, trace_id: str) -> None:
        """Make the next delta restart ``trace_id`` from scratch on the receiver."""
        sender = self._senders.get(trace_id)
        if sender is not None:
            sender.discard()

    def delta(self, *, final: bool = False) -> EpisodeDelta | None:
        """Everything new since the last committed delta (None if nothing, unless final)."""
        e = self.episode
        raw_head = _enc.encode(_head(e))
        head = _head_dec.decode(raw_head) if raw_head != self._last_head else None
        parts: list[tuple[TraceSender, TraceDelta]] = []
        present = set()
        for t in e.traces:
            present.add(t.id)
            sender = self._senders.get(t.id)
            if sender is None:
                sender = self._senders[t.id] = TraceSender(t)
            elif sender.trace is not t:
                # Same id, new object: a retried attempt replaced the trace; start over.
                sender.trace = t
                sender.discard()
            td = sender.delta()
            if td is not None:
                parts.append((sender, td))
        dropped = [i for i in self._sent_ids if i not in present]
        if head is None and not parts and not dropped and not final:
            self._proposed = None
            return None
        d = EpisodeDelta(
            episode=e.id,
            seq=self.seq,
            head=head,
            traces=[td for _, td in parts],
            dropped=dropped,
            final=final,
        )
        self._proposed = (d, raw_head, parts)
        return d

    def commit(self, delta: EpisodeDelta) -> None:
        """Record that ``delta`` reached the receiver."""
        if self._proposed is None or self._proposed[0] is not delta:
            raise DeltaError("commit() of a delta that is not the last one produced")
        _, raw_head, parts = self._proposed
        for sender, td in parts:
            sender.commit(td)
            if td.id not in self._sent_ids:
                self._sent_ids.append(td.id)
        for tid in delta.dropped:
            self._sent_ids.remove(tid)
            self._senders.pop(tid, None)
        self._last_head = raw_head
        self.seq += 1
        self._proposed = None


def _check_trace_delta(t: Trace | None, d: TraceDelta) -> None:
    have = Cursor() if t is None or d.reset else cursor_of(t)
    if d.base != have:
        raise DeltaError(
            f"trace {d.id}: delta starts at {d.base} but the receiver holds {have} "
            "(a delta was lost or reordered)"
        )
    n = d.n_tokens
    if d.columns and "ids" not in d.columns:
        raise DeltaError(f"trace {d.id}: columns without 'ids'")
    for name, arr in d.columns.items():
        want = BASE_COLUMNS.get(name)
        if want is not None and arr.dtype != want:
            raise DeltaError(f"trace {d.id}: column {name!r} must be {want}, got {arr.dtype}")
        if arr.shape[:1] != (n,):
            raise DeltaError(f"trace {d.id}: column {name!r} has {arr.shape[:1]} rows, not {n}")
    if t is not None and not d.reset and d.columns:
        for name, arr in d.columns.items():
            have_spec = t.columns.spec(name)
            if have_spec is not None and have_spec != (arr.dtype, arr.shape[1:]):
                raise DeltaError(f"trace {d.id}: column {name!r} changes dtype or shape")
    try:
        validate_trace(d.nodes, d.calls, d.end.tokens, base=d.base.nodes)
    except ValueError as exc:
        raise DeltaError(f"trace {d.id}: {exc}") from exc


class EpisodeAssembler:
    """Applies a stream of :class:`EpisodeDelta` to rebuild the sender's episode.

    A delta is checked whole before anything is changed, so a rejected delta leaves the
    assembled episode as it was.
    """

    def __init__(self) -> None:
        self.episode: Episode | None = None
        self.seq = 0
        self.final = False

    def apply(self, d: EpisodeDelta) -> Episode:
        """Apply one delta; raises ``DeltaError`` if it is out of sequence or inconsistent."""
        if d.seq != self.seq:
            raise DeltaError(f"episode {d.episode}: expected delta {self.seq}, got {d.seq}")
        if self.episode is not None and d.episode != self.episode.id:
            raise DeltaError(f"delta for episode {d.episode} sent to {self.episode.id}")
        if self.episode is None and d.head is None:
            raise DeltaError(f"episode {d.episode}: first delta carries no head")
        by_id = {} if self.episode is None else {t.id: t for t in self.episode.traces}
        for td in d.traces:
            _check_trace_delta(by_id.get(td.id), td)
        for tid in d.dropped:
            if tid not in by_id:
                raise DeltaError(f"episode {d.episode}: dropping unknown trace {tid}")
        # All checks passed: mutate.
        if self.episode is None:
            self.episode = Episode(d.episode)
        e = self.episode
        if d.head is not None:
            # The head was decoded for this delta alone: copy its containers so later
            # changes to the episode never reach into the delta.
            set_episode_fields(e, msgspec.structs.replace(
                d.head, task=dict(d.head.task), errors=list(d.head.errors),
                timing=dict(d.head.timing), info=dict(d.head.info)))
        if d.dropped:
            e.traces = [t for t in e.traces if t.id not in d.dropped]
        for td in d.traces:
            _apply_trace(e, td)
        self.seq += 1
        self.final = self.final or d.final
        return e


def _apply_trace(e: Episode, d: TraceDelta) -> None:
    t = next((x for x in e.traces if x.id == d.id), None)
    if t is None or d.reset:
        fresh = Trace(d.id)
        if t is None:
            e.traces.append(fresh)
        else:
            e.traces[e.traces.index(t)] = fresh
        t = fresh
    t.nodes.extend(d.nodes)
    t.calls.extend(d.calls)
    t.errors.extend(d.errors)
    if d.columns:
        t.columns.extend(d.columns)
    for name in _SCALARS:
        value = getattr(d, name)
        if value is not UNSET:
            # Containers are copied so later deltas never share state with this one.
            setattr(t, name, value.copy() if isinstance(value, dict | list) else value)
