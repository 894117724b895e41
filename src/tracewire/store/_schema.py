"""The run index: one SQLite row per stored episode. The schema is defined here only.

Rows are computed from an episode record's msgpack header by a light decoder that skips
nodes and token buffers, so indexing bytes received over the wire (or rebuilding rows
during recovery) never decodes or re-encodes the columns.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable
from typing import Any

import msgspec
import orjson

from .._errors import DecodeError
from ._status import EpisodeStatus

__all__ = [
    "COLUMNS",
    "INDEX_VERSION",
    "IndexRow",
    "RecordRef",
    "create_sql",
    "insert_sql",
    "row_from_header",
]

#: Bumped when the table changes incompatibly; stored as ``PRAGMA user_version``.
INDEX_VERSION = 1

#: Column name -> SQLite type, in table order (``seq`` is the implicit append order).
COLUMNS: dict[str, str] = {
    "episode_id": "TEXT NOT NULL UNIQUE",
    "run": "TEXT",
    "env": "TEXT",
    "task_key": "TEXT",
    "group_id": "TEXT",
    "group_index": "INTEGER",
    "status": "TEXT",
    "ok": "INTEGER",
    "stop": "TEXT",
    "reward": "REAL",
    "rewards": "TEXT",
    "metrics": "TEXT",
    "turns": "INTEGER",
    "input_tokens": "INTEGER",
    "output_tokens": "INTEGER",
    "n_tokens": "INTEGER",
    "n_traces": "INTEGER",
    "errors": "INTEGER",
    "started": "REAL",
    "ended": "REAL",
    "duration": "REAL",
    "written": "REAL",
    "segment": "INTEGER",
    "offset": "INTEGER",
    "length": "INTEGER",
    "crc": "INTEGER",
}


def create_sql() -> list[str]:
    """Statements creating the index (idempotent)."""
    cols = ",\n  ".join(f'"{name}" {typ}' for name, typ in COLUMNS.items())
    return [
        f"CREATE TABLE IF NOT EXISTS episodes (\n  seq INTEGER PRIMARY KEY AUTOINCREMENT,\n"
        f"  {cols}\n)",
        "CREATE INDEX IF NOT EXISTS episodes_task ON episodes (task_key, group_index)",
        "CREATE INDEX IF NOT EXISTS episodes_env ON episodes (env)",
        "CREATE INDEX IF NOT EXISTS episodes_status ON episodes (status)",
        "CREATE INDEX IF NOT EXISTS episodes_ref ON episodes (segment, offset)",
    ]


def insert_sql() -> str:
    """Upsert of one row (a re-appended episode id replaces its older row)."""
    names = ", ".join(f'"{n}"' for n in COLUMNS)
    marks = ", ".join("?" for _ in COLUMNS)
    return f"INSERT OR REPLACE INTO episodes ({names}) VALUES ({marks})"


@dataclasses.dataclass(frozen=True, slots=True)
class RecordRef:
    """Where a record lives: segment number, byte offset, length and its header CRC."""

    segment: int
    offset: int
    length: int
    crc: int


@dataclasses.dataclass(frozen=True, slots=True)
class IndexRow:
    """One episode's index row (``rewards`` and ``metrics`` decoded from their JSON)."""

    episode_id: str
    run: str
    env: str
    task_key: str
    group_id: str | None
    group_index: int
    status: str
    ok: bool
    stop: str | None
    reward: float
    rewards: dict[str, float]
    metrics: dict[str, float]
    turns: int
    input_tokens: int
    output_tokens: int
    n_tokens: int
    n_traces: int
    errors: int
    started: float | None
    ended: float | None
    duration: float | None
    written: float
    segment: int
    offset: int
    length: int
    crc: int

    @property
    def ref(self) -> RecordRef:
        """The record's location."""
        return RecordRef(self.segment, self.offset, self.length, self.crc)

    def values(self) -> tuple[Any, ...]:
        """Values in ``COLUMNS`` order, ready for :func:`insert_sql`."""
        return (
            self.episode_id, self.run, self.env, self.task_key, self.group_id,
            self.group_index, self.status, int(self.ok), self.stop, self.reward,
            orjson.dumps(self.rewards).decode(), orjson.dumps(self.metrics).decode(),
            self.turns, self.input_tokens, self.output_tokens, self.n_tokens, self.n_traces,
            self.errors, self.started, self.ended, self.duration, self.written,
            self.segment, self.offset, self.length, self.crc,
        )  # fmt: skip

    @classmethod
    def from_sql(cls, values: tuple[Any, ...]) -> IndexRow:
        """Build from a ``SELECT <COLUMNS>`` result row."""
        d = dict(zip(COLUMNS, values, strict=True))
        d["ok"] = bool(d["ok"])
        d["rewards"] = orjson.loads(d["rewards"] or "{}")
        d["metrics"] = orjson.loads(d["metrics"] or "{}")
        return cls(**d)

    def as_dict(self) -> dict[str, Any]:
        """Plain dict of the row."""
        return dataclasses.asdict(self)


# -- light decoding of an episode header ---------------------------------------------------


class _Span(msgspec.Struct):
    start: float
    end: float | None = None


class _Reward(msgspec.Struct):
    score: float
    weight: float = 1.0


class _Call(msgspec.Struct):
    usage: dict[str, int] = {}
    span: _Span | None = None


class _Trace(msgspec.Struct):
    errors: list[msgspec.Raw] = []
    calls: list[_Call] = []
    timing: dict[str, _Span] = {}
    rewards: dict[str, _Reward] = {}
    metrics: dict[str, float] = {}
    stop: str | None = None
    columns: dict[str, list[Any]] = {}


class _Episode(msgspec.Struct, tag="episode"):
    id: str
    env: str = ""
    task_key: str = ""
    group_id: str | None = None
    group_index: int = 0
    run: str = ""
    ok: bool = True
    errors: list[msgspec.Raw] = []
    timing: dict[str, _Span] = {}
    info: dict[str, Any] = {}
    traces: list[_Trace] = []


_light = msgspec.msgpack.Decoder(_Episode)
_PREFIX = struct.Struct("<4sHHIIQII")


def _usage(u: dict[str, int], *keys: str) -> int:
    for k in keys:
        v = u.get(k)
        if v is not None:
            return int(v)
    return 0


def row_from_episode(
    ep: Any, ref: RecordRef, written: float, pause: Callable[[], None] | None = None
) -> IndexRow:
    """Index row of a live :class:`~tracewire.Episode` (plain Python, with ``pause()`` every
    512 calls so the writer thread lets the event loop in during long episodes)."""
    return _row(ep, ref, written, n_tokens=lambda t: len(t.tokens), pause=pause)


def row_from_header(
    header: bytes | bytearray | memoryview, ref: RecordRef, written: float
) -> IndexRow:
    """Index row of the episode whose msgpack header is ``header`` (skips nodes/buffers)."""
    try:
        e = _light.decode(header)
    except msgspec.DecodeError as exc:  # includes ValidationError
        raise DecodeError(f"not an episode header: {exc}") from exc
    return _row(e, ref, written, n_tokens=_header_tokens)


def _header_tokens(t: Any) -> int:
    ids = t.columns.get("ids")
    return int(ids[2][0]) if ids and len(ids) == 3 and ids[2] else 0


def _row(
    e: Any, ref: RecordRef, written: float, n_tokens: Any, pause: Callable[[], None] | None = None
) -> IndexRow:
    started: float | None = None
    ended: float | None = None

    def see(span: Any) -> None:
        nonlocal started, ended
        if started is None or span.start < started:
            started = span.start
        if span.end is not None and (ended is None or span.end > ended):
            ended = span.end

    for span in e.timing.values():
        see(span)
    turns = inp = out = n_tok = errors = 0
    for t in e.traces:
        for span in t.timing.values():
            see(span)
        turns += len(t.calls)
        errors += len(t.errors)
        for k, c in enumerate(t.calls):
            # ~3 µs per call: pause every 128 so the writer never holds the GIL ~0.5 ms.
            if pause is not None and k and not k & 127:
                pause()
            if c.span is not None:
                see(c.span)
            inp += _usage(c.usage, "prompt_tokens", "input_tokens")
            out += _usage(c.usage, "completion_tokens", "output_tokens")
        n_tok += n_tokens(t)
    main = e.traces[0] if e.traces else _Trace()
    return IndexRow(
        episode_id=e.id,
        run=e.run,
        env=e.env,
        task_key=e.task_key,
        group_id=e.group_id,
        group_index=e.group_index,
        status=(EpisodeStatus.INCOMPLETE if e.info.get("incomplete")
                else EpisodeStatus.COMPLETE).value,
        ok=e.ok,
        stop=main.stop,
        reward=float(sum(r.score * r.weight for r in main.rewards.values())),
        rewards={k: r.score for k, r in main.rewards.items()},
        metrics=dict(main.metrics),
        turns=turns,
        input_tokens=inp,
        output_tokens=out,
        n_tokens=n_tok,
        n_traces=len(e.traces),
        errors=errors + len(e.errors),
        started=started,
        ended=ended,
        duration=None if started is None or ended is None else ended - started,
        written=written,
        segment=ref.segment,
        offset=ref.offset,
        length=ref.length,
        crc=ref.crc,
    )


def record_parts_info(prefix: bytes | memoryview) -> tuple[int, int, int, int]:
    """``(total, header_offset, header_len, header_crc)`` from a record's 32-byte prefix."""
    magic, _, _, hlen, nbuf, total, hcrc, _ = _PREFIX.unpack_from(prefix)
    if magic != b"TWR1":
        raise DecodeError("not a tracewire record")
    return int(total), _PREFIX.size + 16 * int(nbuf), int(hlen), int(hcrc)
