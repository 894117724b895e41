"""The run index: one SQLite row per stored episode. The schema is defined here only.

:class:`IndexRow` declares the columns (each field's SQL type in its metadata); ``COLUMNS``,
the statements and the row conversions are derived from it (what a row holds for an
episode is computed in ``_rows.py``).

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
from collections.abc import Iterable, Sequence
from typing import Any

import crc32c
import msgspec
import orjson

from .._errors import StoreError
from ..trace import InfoKey

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


def insert_sql(*, at_seq: bool = False) -> str:
    """Upsert of one row (a re-appended episode id replaces its older row), binding
    :meth:`IndexRow.stored`; with ``at_seq`` it binds ``(seq, *stored)``, so a rewritten row
    keeps its place in the append order (a repair's fix in place)."""
    names = ["seq", *stored_columns()] if at_seq else stored_columns()
    cols = ", ".join(f'"{n}"' for n in names)
    marks = ", ".join("?" for _ in names)
    return f"INSERT OR REPLACE INTO episodes ({cols}) VALUES ({marks})"


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
