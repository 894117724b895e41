"""``RunReader``: the read side of a run directory (index rows, records, live journals).

A reader changes nothing on disk: its index connection is read-only and it never takes the
writer lock, so it works on a read-only mount and beside a live writer in another process
(each query sees the latest committed rows; segments are append-only).
"""

from __future__ import annotations

import operator
import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from types import TracebackType
from typing import Any

from .._errors import CorruptRecordError, DecodeError, StoreError
from ..codec import decode_record
from ..trace import Episode
from ._check import CheckReport, verify_run
from ._layout import Layout, read_meta, store_error
from ._live import LiveTails
from ._recover import columns_of, connect, fetch_all
from ._schema import COLUMNS, ROW_CRC, IndexRow, RecordRef, check_rows, select_list, stored_columns
from ._segments import read_record
from ._status import RunStatus

__all__ = ["RunReader"]

_ORDER = {"seq", *COLUMNS}
#: Position of each column in a ``SELECT seq, <stored_columns()>`` row.
_POS = {c: i for i, c in enumerate(["seq", *stored_columns()])}
#: Most ``?`` marks bound in one ``IN (...)`` query.
_CHUNK = 500


class RunReader:
    """A run opened for reading (:meth:`open`, or ``open_run``); a :class:`RunWriter`
    is one too, so everything here also works on the run being written."""

    def __init__(self, layout: Layout, meta: dict[str, Any]) -> None:
        self.layout = layout
        self.path = layout.root
        self._meta = meta
        self._conn = connect(layout, write=False)
        try:
            # An index written by an older build may lack appended columns: read them NULL.
            self._present = columns_of(self._conn)
            # Every read fetches the whole row and checks its row_crc (see _schema).
            self._select = "seq, " + select_list(self._present, stored_columns())
            self._crc_required = ROW_CRC in self._present
        except sqlite3.Error as exc:
            self._conn.close()
            raise store_error(f"cannot read index of {layout.root}", exc) from exc
        self._db_lock = threading.Lock()
        self._fds: dict[int, int] = {}
        self._live = LiveTails(layout, self._indexed)
        self._closed = False

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> RunReader:
        """Open ``path`` for reading. Nothing on disk is changed (a read-only directory or
        mount works): a run whose writer crashed reads as it is; :meth:`verify` reports
        what is wrong and ``Run.repair`` (or ``tracewire check --repair``) fixes it."""
        layout = Layout(path)
        return RunReader(layout, read_meta(layout))

    @property
    def writable(self) -> bool:
        """True for a run opened for appending and not closed (never for a reader)."""
        return False

    @property
    def meta(self) -> dict[str, Any]:
        """The metadata (config, versions, times, status); a reader re-reads it each time."""
        try:
            self._meta = read_meta(self.layout)
        except StoreError:
            pass
        return self._meta

    def verify(self) -> CheckReport:
        """Check every record and index row without changing anything (see
        ``tracewire check``): records decode, rows match their records' headers,
        segments have no gaps or torn tails."""
        with self._db_lock:
            try:
                return verify_run(self.layout, self._conn, self.meta.get("status"))
            except sqlite3.Error as exc:
                raise store_error(f"cannot check {self.path}", exc) from exc

    # -- closing ----------------------------------------------------------------------------
    async def close(self, status: RunStatus | str = RunStatus.COMPLETE) -> None:
        """Release the run's files (``status`` only means something to a writer)."""
        if not self._closed:
            self._release()

    def _release(self) -> None:
        self._closed = True
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self._conn.close()

    def __enter__(self) -> RunReader:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._release()

    async def __aenter__(self) -> RunReader:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close(RunStatus.COMPLETE if et is None else RunStatus.INTERRUPTED)

    # -- index rows -------------------------------------------------------------------------
    def _query(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        try:
            with self._db_lock:
                return fetch_all(self._conn, sql, args)
        except sqlite3.Error as exc:
            raise store_error(f"cannot read index of {self.path}", exc) from exc

    def _where(self, filters: dict[str, Any]) -> tuple[str, list[Any]]:
        clauses: list[str] = []
        args: list[Any] = []
        for name, value in filters.items():
            if name not in COLUMNS:
                raise ValueError(f"unknown index column {name!r}; known: {', '.join(COLUMNS)}")
            if value is None:
                clauses.append(f'"{name}" IS NULL')
            elif isinstance(value, list | tuple | set | frozenset):
                clauses.append(f'"{name}" IN ({", ".join("?" for _ in value)})')
                args.extend(value)
            else:
                clauses.append(f'"{name}" = ?')
                args.append(int(value) if isinstance(value, bool) else value)
        return (" WHERE " + " AND ".join(clauses)) if clauses else "", args

    def rows(
        self, *, limit: int | None = None, order_by: str = "seq", **filters: Any
    ) -> list[IndexRow]:
        """Index rows matching equality ``filters`` (a list means "any of"), in append order."""
        if order_by.lstrip("-") not in _ORDER:
            raise ValueError(f"cannot order by {order_by!r}")
        where, args = self._where(filters)
        desc = " DESC" if order_by.startswith("-") else ""
        sql = f'SELECT {self._select} FROM episodes{where} ORDER BY "{order_by.lstrip("-")}"{desc}'
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        req = self._crc_required
        return [IndexRow.from_stored(r[0], r[1:], req) for r in self._query(sql, args)]

    def _checked(self, where: str, args: Sequence[Any], columns: Sequence[str]
                 ) -> list[tuple[Any, ...]]:
        """Raw values of ``columns`` of the rows ``where`` selects, each row's checksum
        verified first (a damaged row raises ``StoreError`` naming it)."""
        rows = self._query(f"SELECT {self._select} FROM episodes{where}", args)
        check_rows(rows, self._crc_required)
        pos = [_POS[c] for c in columns]
        if len(pos) == 1:
            return [(r[pos[0]],) for r in rows]
        get = operator.itemgetter(*pos)
        return [get(r) for r in rows]

    def __len__(self) -> int:
        return int(self._query("SELECT COUNT(*) FROM episodes")[0][0])

    @staticmethod
    def _columns(columns: Sequence[str]) -> list[str]:
        for c in columns:
            if c not in _ORDER:
                raise ValueError(f"unknown index column {c!r}; known: seq, {', '.join(COLUMNS)}")
        return list(columns)

    def index_head(self) -> int:
        """The highest ``seq`` in the index (0 when empty; one B-tree probe): rows only ever
        arrive with a higher ``seq`` (a replaced row too), so a reader polls this to learn
        whether to catch up, and counts rows (``len(run)``) only when it moved."""
        return int(self._query("SELECT COALESCE(MAX(seq), 0) FROM episodes")[0][0])

    def index_since(self, seq: int, columns: Sequence[str]) -> list[tuple[Any, ...]]:
        """Raw values of ``columns`` (index column names, or ``"seq"``) of every row with a
        ``seq`` above ``seq``, in ``seq`` order (``rewards``/``metrics`` as JSON text);
        a damaged row raises ``StoreError``."""
        return self._checked(" WHERE seq > ? ORDER BY seq", (int(seq),), self._columns(columns))

    def index_at(self, seqs: Sequence[int], columns: Sequence[str]) -> list[tuple[Any, ...]]:
        """Raw values of ``columns`` of the rows with the given ``seq`` values (any order;
        missing ones are left out)."""
        out: list[tuple[Any, ...]] = []
        cols = self._columns(columns)
        for i in range(0, len(seqs), _CHUNK):
            chunk = [int(s) for s in seqs[i : i + _CHUNK]]
            marks = ", ".join("?" for _ in chunk)
            out += self._checked(f" WHERE seq IN ({marks})", chunk, cols)
        return out

    def index(self, kind: str = "pandas") -> Any:
        """The index as a DataFrame (``kind``: "pandas" or "polars"); rewards/metrics JSON."""
        cols = ["seq", *COLUMNS]
        rows = self._checked(" ORDER BY seq", (), cols)
        data = {c: [r[i] for r in rows] for i, c in enumerate(cols)}
        if kind == "pandas":
            import pandas as pd

            return pd.DataFrame(data, columns=cols)
        if kind == "polars":
            import polars as pl

            return pl.DataFrame(data, strict=False)
        raise ValueError(f"kind must be 'pandas' or 'polars', not {kind!r}")

    def completed_pairs(self) -> set[tuple[str, int]]:
        """``(task_key, group_index)`` of every episode stored complete (for resume)."""
        got = self._checked(" WHERE status = 'complete'", (), ["task_key", "group_index"])
        return {(str(k), int(i)) for k, i in got}

    def _indexed(self, episode_ids: list[str]) -> set[str]:
        """Which of ``episode_ids`` have an index row (one query per 500 ids)."""
        found: set[str] = set()
        for i in range(0, len(episode_ids), _CHUNK):
            chunk = episode_ids[i : i + _CHUNK]
            marks = ", ".join("?" for _ in chunk)
            rows = self._query(f"SELECT episode_id FROM episodes WHERE episode_id IN ({marks})",
                               chunk)
            found.update(str(r[0]) for r in rows)
        return found

    # -- records ----------------------------------------------------------------------------
    def read(self, ref: RecordRef) -> Episode:
        """The episode stored at ``ref`` (one ``pread``, CRC-checked, buffers not copied)."""
        fd = self._fds.get(ref.segment)
        try:
            if fd is None:
                fd = self._fds[ref.segment] = os.open(self.layout.segment(ref.segment), os.O_RDONLY)
            data = read_record(fd, ref)
        except OSError as exc:
            raise store_error(f"cannot read segment {ref.segment}", exc) from exc
        try:
            obj = decode_record(data)
        except DecodeError as exc:
            raise CorruptRecordError(
                0, f"record at segment {ref.segment} offset {ref.offset}: {exc}"
            ) from exc
        if not isinstance(obj, Episode):
            raise CorruptRecordError(0, f"record at {ref} is not an episode")
        return obj

    def get(self, episode_id: str) -> Episode:
        """One episode by id; ``KeyError`` if the run has none."""
        found = self.rows(episode_id=episode_id)
        if not found:
            raise KeyError(episode_id)
        ep = self.read(found[0].ref)
        if ep.id != episode_id:
            raise CorruptRecordError(
                0, f"the index row of episode {episode_id!r} points at episode {ep.id!r} "
                "(damaged index: run `tracewire check --repair`)"
            )
        return ep

    def episodes(self, **filters: Any) -> Iterator[Episode]:
        """Episodes matching ``filters`` (as :meth:`rows`), read lazily one at a time."""
        for row in self.rows(**filters):
            yield self.read(row.ref)

    def __iter__(self) -> Iterator[Episode]:
        return self.episodes()

    def live(self) -> list[Episode]:
        """In-flight episodes assembled from their journals (those not yet appended), each
        with its latest ``pending`` messages.

        Incremental: per journal, only the bytes appended since the previous call are read
        and applied to the episode assembled then, so a returned episode is the same object
        on the next call, grown in place (lists and columns only grow; a restarted trace is
        replaced). Journals that disappeared or whose episode is indexed are forgotten.
        """
        return self._live.poll()
