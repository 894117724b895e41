"""The run index: one SQLite row per stored episode. The schema is defined here only.

:class:`IndexRow` declares the columns (each field's SQL type in its metadata); ``COLUMNS``,
the statements and the row conversions are derived from it. Rows are computed from an
episode record's header by the codec's light decoder (``tracewire.codec.decode_summary``),
which skips nodes and token buffers, so indexing bytes received over the wire (or rebuilding
rows during recovery) never decodes or re-encodes the columns.

Evolution (docs/SCHEMA.md): columns are only appended, nullable, at the end; a writer adds
the ones an older index lacks (``ALTER TABLE ... ADD COLUMN``), a reader of an older index
reads them as NULL, so old runs still open.

Every row also stores ``row_crc``, a CRC32C of its other values (not an :class:`IndexRow`
field, not in ``COLUMNS``): a reader recomputes it, so a flipped byte in any column is a
:class:`~tracewire.StoreError` naming the row, never a silently different value.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import crc32c
import msgspec
import orjson

from .._errors import StoreError
from ..codec import TraceSummary, decode_summary
from ..trace import InfoKey
from ._status import EpisodeStatus

__all__ = [
    "COLUMNS",
    "INDEX_VERSION",
    "ROW_CRC",
    "IndexRow",
    "RecordRef",
    "add_columns_sql",
    "check_row",
    "check_rows",
    "create_sql",
    "insert_sql",
    "row_crc",
    "row_from_episode",
    "row_from_header",
    "rows_differ",
    "select_list",
    "stored_columns",
]

#: Bumped when the table changes incompatibly; stored as ``PRAGMA user_version``.
INDEX_VERSION = 1


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

    episode_id: str = dataclasses.field(metadata={"sql": "TEXT NOT NULL UNIQUE"})
    run: str = dataclasses.field(metadata={"sql": "TEXT"})
    env: str = dataclasses.field(metadata={"sql": "TEXT"})
    task_key: str = dataclasses.field(metadata={"sql": "TEXT"})
    group_id: str | None = dataclasses.field(metadata={"sql": "TEXT"})
    group_index: int = dataclasses.field(metadata={"sql": "INTEGER"})
    status: str = dataclasses.field(metadata={"sql": "TEXT"})
    ok: bool = dataclasses.field(metadata={"sql": "INTEGER"})
    stop: str | None = dataclasses.field(metadata={"sql": "TEXT"})
    reward: float = dataclasses.field(metadata={"sql": "REAL"})
    rewards: dict[str, float] = dataclasses.field(metadata={"sql": "TEXT"})
    metrics: dict[str, float] = dataclasses.field(metadata={"sql": "TEXT"})
    turns: int = dataclasses.field(metadata={"sql": "INTEGER"})
    input_tokens: int = dataclasses.field(metadata={"sql": "INTEGER"})
    output_tokens: int = dataclasses.field(metadata={"sql": "INTEGER"})
    n_tokens: int = dataclasses.field(metadata={"sql": "INTEGER"})
    n_traces: int = dataclasses.field(metadata={"sql": "INTEGER"})
    errors: int = dataclasses.field(metadata={"sql": "INTEGER"})
    started: float | None = dataclasses.field(metadata={"sql": "REAL"})
    ended: float | None = dataclasses.field(metadata={"sql": "REAL"})
    duration: float | None = dataclasses.field(metadata={"sql": "REAL"})
    written: float = dataclasses.field(metadata={"sql": "REAL"})
    segment: int = dataclasses.field(metadata={"sql": "INTEGER"})
    offset: int = dataclasses.field(metadata={"sql": "INTEGER"})
    length: int = dataclasses.field(metadata={"sql": "INTEGER"})
    crc: int = dataclasses.field(metadata={"sql": "INTEGER"})
    # Appended columns (nullable, default NULL): trainer bookkeeping from episode.info.
    step: int | None = dataclasses.field(default=None, metadata={"sql": "INTEGER"})
    policy_version: int | None = dataclasses.field(default=None, metadata={"sql": "INTEGER"})
    # Token-in/token-out: non-benign differences of the recorded ids from a canonical
    # render (episode.info["tito_mismatch"]); NULL for pass-through runs.
    tito_mismatch: int | None = dataclasses.field(default=None, metadata={"sql": "INTEGER"})

    @property
    def ref(self) -> RecordRef:
        """The record's location."""
        return RecordRef(self.segment, self.offset, self.length, self.crc)

    def values(self) -> tuple[Any, ...]:
        """Values in ``COLUMNS`` order, ready for :func:`insert_sql`."""
        out = []
        for name in COLUMNS:
            v = getattr(self, name)
            if name in _JSON:
                v = orjson.dumps(v).decode()
            elif name == "ok":
                v = int(v)
            elif isinstance(v, int) and not -(2**63) <= v < 2**63:
                raise OverflowError(f"index column {name!r}: {v} does not fit in 64 bits")
            elif name in _REAL and v is not None:
                # What SQLite gives back: REAL, NaN as NULL, -0.0 as 0.0 (so row_crc holds).
                v = float(v) + 0.0
                if v != v:
                    v = None
            out.append(v)
        return tuple(out)

    def stored(self) -> tuple[Any, ...]:
        """Values in ``COLUMNS`` order followed by their ``row_crc`` (what :func:`insert_sql`
        binds)."""
        values = self.values()
        return (*values, _crc(values))

    @classmethod
    def from_stored(cls, seq: Any, values: Sequence[Any], required: bool = True) -> IndexRow:
        """Build from a ``SELECT`` of :func:`stored_columns`, checking ``row_crc`` first
        (:func:`check_row`): a damaged row raises ``StoreError`` naming it."""
        check_row(seq, values, required)
        return cls.from_sql(values[:-1])

    @classmethod
    def from_sql(cls, values: Iterable[Any]) -> IndexRow:
        """Build from a ``SELECT <select_list()>`` result row; a value of the wrong type (a
        damaged index) raises ``StoreError``, never a library error."""
        d = dict(zip(COLUMNS, values, strict=True))
        for name, v in d.items():
            ok_types, nullable = _CHECK[name]
            if v is None and nullable:
                continue
            if not isinstance(v, ok_types) or isinstance(v, bool):
                raise StoreError(
                    0, f"index row has {type(v).__name__} in column {name!r}: damaged index "
                    "(run `tracewire check --repair`)"
                )
        d["ok"] = bool(d["ok"])
        for name in _JSON:
            try:
                obj = orjson.loads(d[name] or "{}")
            except orjson.JSONDecodeError as exc:
                raise StoreError(0, f"index column {name!r} is not JSON: damaged index") from exc
            if not isinstance(obj, dict):
                raise StoreError(0, f"index column {name!r} is not an object: damaged index")
            d[name] = obj
        return cls(**d)

    def as_dict(self) -> dict[str, Any]:
        """Plain dict of the row."""
        return dataclasses.asdict(self)


#: Column name -> SQLite type, in table order (``seq`` is the implicit append order).
COLUMNS: dict[str, str] = {f.name: f.metadata["sql"] for f in dataclasses.fields(IndexRow)}
_JSON = ("rewards", "metrics")
_NULLABLE = {"group_id", "stop", "started", "ended", "duration", InfoKey.STEP,
             InfoKey.POLICY_VERSION, InfoKey.TITO_MISMATCH}
_PY = {"TEXT": (str,), "INTEGER": (int,), "REAL": (float, int)}
_CHECK: dict[str, tuple[tuple[type, ...], bool]] = {
    n: (_PY[t.split()[0]], n in _NULLABLE) for n, t in COLUMNS.items()
}
_REAL = frozenset(n for n, t in COLUMNS.items() if t.split()[0] == "REAL")
_REAL_POS = tuple(i for i, n in enumerate(COLUMNS) if n in _REAL)
#: The checksum column: CRC32C of the row's other values (NULL only in rows an older build
#: wrote, where the index has no such column).
ROW_CRC = "row_crc"
_ROW_CRC_SQL = "INTEGER"
_ENCODE = msgspec.msgpack.Encoder()
#: Columns present since the first index version; later ones may be missing in old runs.
_ORIGINAL = tuple(COLUMNS)[: tuple(COLUMNS).index("step")]


def stored_columns() -> list[str]:
    """Every stored column after ``seq``: ``COLUMNS`` then ``row_crc``."""
    return [*COLUMNS, ROW_CRC]


def row_crc(values: Sequence[Any]) -> int:
    """CRC32C of a row's values in ``COLUMNS`` order, taken as SQLite gives them back
    (a REAL column's int as float, NaN as NULL, -0.0 as 0.0); msgpack keeps types apart,
    so 1 and 1.0, NULL and "" differ. Whoever writes index rows binds this as ``row_crc``."""
    vals = list(values)
    for i in _REAL_POS:
        v = vals[i] if i < len(vals) else None
        if isinstance(v, int | float) and not isinstance(v, bool):
            f = float(v) + 0.0
            vals[i] = None if f != f else f
    return _crc(vals)


def _crc(values: Sequence[Any]) -> int:
    # Values already in SQLite's form (IndexRow.values(), or read back): no conversion, so
    # a REAL cell that reads back as an int (a damaged type byte) fails too.
    try:
        return int(crc32c.crc32c(_ENCODE.encode(values)))
    except (UnicodeEncodeError, msgspec.EncodeError, OverflowError):
        return -1  # matches no stored checksum (those are unsigned)


def check_row(seq: Any, values: Sequence[Any], required: bool) -> None:
    """Raise ``StoreError`` naming the row when the stored ``row_crc`` (``values[-1]``, after
    the ``COLUMNS`` values) does not match; ``required`` False accepts rows with no checksum
    (an index written before the column existed)."""
    crc = values[-1]
    if crc is None and not required:
        return
    if isinstance(crc, int) and not isinstance(crc, bool) and crc == _crc(values[:-1]):
        return
    ident = values[0] if isinstance(values[0], str) and len(values[0]) <= 64 else None
    what = f"seq {seq}" + (f" (episode {ident!r})" if ident else "")
    why = "has no checksum" if crc is None else "does not match its checksum"
    raise StoreError(0, f"index row {what} {why}: damaged index "
                     "(run `tracewire check --repair`)")


def check_rows(rows: Iterable[Sequence[Any]], required: bool) -> None:
    """:func:`check_row` of many ``(seq, *stored values)`` rows, at ~2 µs a row."""
    enc, crc = _ENCODE.encode, crc32c.crc32c
    for r in rows:
        c = r[-1]
        try:
            if type(c) is int and c == crc(enc(r[1:-1])):
                continue
        except (UnicodeEncodeError, msgspec.EncodeError, OverflowError):
            pass
        check_row(r[0], r[1:], required)


def create_sql() -> list[str]:
    """Statements creating the index (idempotent)."""
    cols = ",\n  ".join(f'"{name}" {typ}' for name, typ in
                        [*COLUMNS.items(), (ROW_CRC, _ROW_CRC_SQL)])
    return [
        f"CREATE TABLE IF NOT EXISTS episodes (\n  seq INTEGER PRIMARY KEY AUTOINCREMENT,\n"
        f"  {cols}\n)",
        "CREATE INDEX IF NOT EXISTS episodes_task ON episodes (task_key, group_index)",
        "CREATE INDEX IF NOT EXISTS episodes_env ON episodes (env)",
        "CREATE INDEX IF NOT EXISTS episodes_status ON episodes (status)",
        "CREATE INDEX IF NOT EXISTS episodes_ref ON episodes (segment, offset)",
    ]


def add_columns_sql(present: Iterable[str]) -> list[str]:
    """``ALTER TABLE`` statements adding the columns an older index lacks."""
    have = set(present)
    return [f'ALTER TABLE episodes ADD COLUMN "{n}" {t}'
            for n, t in [*COLUMNS.items(), (ROW_CRC, _ROW_CRC_SQL)]
            if n not in have and n not in _ORIGINAL]


def select_list(present: Iterable[str], columns: Iterable[str] = COLUMNS) -> str:
    """The SELECT list of ``columns``, reading a column an older index lacks as NULL."""
    have = set(present)
    return ", ".join(f'"{c}"' if c in have or c == "seq" else f'NULL AS "{c}"' for c in columns)


def insert_sql() -> str:
    """Upsert of one row (a re-appended episode id replaces its older row), binding
    :meth:`IndexRow.stored`."""
    names = ", ".join(f'"{n}"' for n in stored_columns())
    marks = ", ".join("?" for _ in stored_columns())
    return f"INSERT OR REPLACE INTO episodes ({names}) VALUES ({marks})"


def rows_differ(stored: IndexRow, expected: IndexRow) -> list[str]:
    """Names of the columns where a stored row disagrees with the one its record implies
    (``written``, the time of indexing, is not derived from the record)."""
    out = []
    for name in COLUMNS:
        if name == "written":
            continue
        a, b = getattr(stored, name), getattr(expected, name)
        if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
            continue
        if a != b:
            out.append(name)
    return out


# -- rows from an episode or its header ----------------------------------------------------


def _usage(u: dict[str, int], *keys: str) -> int:
    for k in keys:
        v = u.get(k)
        if v is not None:
            return int(v)
    return 0


def _int_info(info: dict[str, Any], key: str) -> int | None:
    # Trainer bookkeeping is set by user code: anything but a plain int reads as absent.
    v = info.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) and -(2**63) <= v < 2**63 else None


def row_from_episode(
    ep: Any, ref: RecordRef, written: float, pause: Callable[[], None] | None = None
) -> IndexRow:
    """Index row of a live :class:`~tracewire.Episode` (plain Python, with ``pause()`` every
    128 calls so the writer thread lets the event loop in during long episodes)."""
    return _row(ep, ref, written, n_tokens=lambda t: len(t.columns), pause=pause)


def row_from_header(
    header: bytes | bytearray | memoryview, ref: RecordRef, written: float
) -> IndexRow:
    """Index row of the episode whose msgpack header is ``header`` (skips nodes/buffers)."""
    return _row(decode_summary(header), ref, written, n_tokens=_header_tokens)


def _header_tokens(t: TraceSummary) -> int:
    return t.n_tokens


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
            # ~3 µs per call: pause every 128 so the writer never holds the GIL long.
            if pause is not None and k and not k & 127:
                pause()
            if c.span is not None:
                see(c.span)
            inp += _usage(c.usage, "prompt_tokens", "input_tokens")
            out += _usage(c.usage, "completion_tokens", "output_tokens")
        n_tok += n_tokens(t)
    main = e.traces[0] if e.traces else TraceSummary()
    return IndexRow(
        episode_id=e.id,
        run=e.run,
        env=e.env,
        task_key=e.task_key,
        group_id=e.group_id,
        group_index=e.group_index,
        status=(EpisodeStatus.INCOMPLETE if e.info.get(InfoKey.INCOMPLETE)
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
        step=_int_info(e.info, InfoKey.STEP),
        policy_version=_int_info(e.info, InfoKey.POLICY_VERSION),
        tito_mismatch=_int_info(e.info, InfoKey.TITO_MISMATCH),
    )

