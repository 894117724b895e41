"""``Run``: one run directory — durable off-loop appends, journals, and the read API."""

from __future__ import annotations

import asyncio
import errno
import operator
import os
import shutil
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from .._errors import CorruptRecordError, DecodeError, StoreError
from ..codec import decode_record
from ..trace import Episode
from ._check import CheckReport, repair_run, verify_run
from ._journal import Journal, JournalTail
from ._layout import Layout, WriterLock, new_meta, read_meta, store_error, write_meta
from ._recover import columns_of, connect, fetch_all, recover, seal_index
from ._schema import COLUMNS, ROW_CRC, IndexRow, RecordRef, check_rows, select_list, stored_columns
from ._segments import read_record
from ._status import FsyncPolicy, RunStatus
from ._writer import AppendItem, FlushItem, JournalItem, Writer

__all__ = ["Run", "open_run"]

Buffer = bytes | bytearray | memoryview
_ORDER = {"seq", *COLUMNS}
#: Position of each column in a ``SELECT seq, <stored_columns()>`` row.
_POS = {c: i for i, c in enumerate(["seq", *stored_columns()])}


class Run:
    """A run directory. Writers come from :meth:`create`; readers from :meth:`open`.

    Appends are persisted by a writer thread in arrival order; the read API (``rows``,
    ``episodes``, ``get``, ``index``, ``live``) works on both, also while another process
    appends (each query sees the latest committed index rows; segments are append-only).
    """

    def __init__(self, layout: Layout, meta: dict[str, Any], lock: WriterLock | None) -> None:
        self.layout = layout
        self.path = layout.root
        self._meta = meta
        self._lock = lock
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
        self._writer: Writer | None = None
        self._journals: dict[str, Journal] = {}
        self._tails: dict[Path, JournalTail] = {}
        self._tails_lock = threading.Lock()
        self._slots: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    # -- opening ----------------------------------------------------------------------------
    @classmethod
    async def create(
        cls,
        path: str | os.PathLike[str],
        *,
        meta: dict[str, Any] | None = None,
        fsync: FsyncPolicy | str = FsyncPolicy.INTERVAL,
        interval: float = 0.1,
        segment_bytes: int = 256 << 20,
        max_queued: int = 64,
        resume: bool = False,
        switch_interval: float | None = None,
    ) -> Run:
        """Open ``path`` for appending: a new run, or with ``resume`` an existing one
        (recovered first; its new episodes are appended after the old ones).

        ``fsync`` (a :class:`FsyncPolicy` or its string): ``"always"`` (each append returns
        after its bytes are synced), ``"interval"`` (group commit at most every ``interval``
        s) or ``"never"``.
        """
        try:
            fsync = FsyncPolicy(fsync)
        except ValueError:
            known = ", ".join(p.value for p in FsyncPolicy)
            raise ValueError(f"fsync must be one of {known}, not {fsync!r}") from None
        layout = Layout(path)
        config = dict(meta or {})
        run_meta, lock = await asyncio.to_thread(
            _prepare_writer, layout, config, fsync, segment_bytes, resume
        )
        try:
            run = cls(layout, run_meta, lock)
        except BaseException:
            lock.release()
            raise
        run._loop = asyncio.get_running_loop()
        run._slots = asyncio.Semaphore(max_queued)
        run._writer = Writer(
            layout,
            fsync=fsync,
            interval=interval,
            segment_bytes=segment_bytes,
            conn_factory=lambda: connect(layout, write=True),
            switch_interval=switch_interval,
        )
        run._writer.start()
        return run

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> Run:
        """Open ``path`` for reading. Nothing on disk is changed (a read-only directory or
        mount works): a run whose writer crashed reads as it is; :meth:`verify` reports
        what is wrong and :meth:`repair` (or ``tracewire check --repair``) fixes it."""
        layout = Layout(path)
        return cls(layout, read_meta(layout), None)

    def verify(self) -> CheckReport:
        """Check every record and index row without changing anything (see
        ``tracewire check``): records decode, rows match their records' headers,
        segments have no gaps or torn tails."""
        with self._db_lock:
            try:
                return verify_run(self.layout, self._conn, self.meta.get("status"))
            except sqlite3.Error as exc:
                raise store_error(f"cannot check {self.path}", exc) from exc

    @staticmethod
    def repair(path: str | os.PathLike[str]) -> CheckReport:
        """Repair the run at ``path`` on purpose (no writer may hold it): truncate a torn
        tail, index what is missing, rewrite wrong rows, store leftover journals as
        incomplete. Intact records are never deleted. Returns a check made afterwards."""
        return repair_run(path)

    @property
    def writable(self) -> bool:
        """True for a run opened with :meth:`create` and not closed."""
        return self._writer is not None and not self._closed

    @property
    def meta(self) -> dict[str, Any]:
        """The metadata (config, versions, times, status); readers re-read it each time."""
        if self._writer is None:
            try:
                self._meta = read_meta(self.layout)
            except StoreError:
                pass
        return self._meta

    # -- writing ----------------------------------------------------------------------------
    def _need_writer(self) -> Writer:
        w = self._writer
        if w is None or self._closed:
            raise StoreError(0, f"run {self.path} is not open for writing")
        if w.fatal is not None:
            raise StoreError(0, f"run {self.path}: writer failed: {w.fatal}") from w.fatal
        return w

    async def _submit(self, episode: Episode | None, frames: Sequence[Buffer] | None) -> RecordRef:
        writer = self._need_writer()
        assert self._slots is not None
        loop = asyncio.get_running_loop()
        await self._slots.acquire()  # bounded queue: FIFO backpressure
        fut: asyncio.Future[RecordRef] = loop.create_future()
        journal = None
        if episode is not None:
            j = self._journals.pop(episode.id, None)
            if j is not None:
                j.close()
                journal = j.path
        slots = self._slots

        def resolve(ref: RecordRef | None, exc: BaseException | None) -> None:
            slots.release()
            if fut.done():  # the caller was cancelled; the record is stored all the same
                return
            if exc is not None:
                fut.set_exception(exc)
            else:
                assert ref is not None
                fut.set_result(ref)

        def done(ref: RecordRef | None, exc: BaseException | None) -> None:
            try:
                loop.call_soon_threadsafe(resolve, ref, exc)
            except RuntimeError:  # loop closed: nobody is waiting any more
                pass

        writer.q.put(AppendItem(episode, frames, done, journal))
        return await fut

    async def append(self, episode: Episode) -> RecordRef:
        """Persist a finished episode; returns once durable under the fsync policy.

        The store takes ownership of ``episode`` until this returns: do not mutate it while
        the append is pending (it is encoded in the writer thread, sharing its memory).
        Cancelling the caller does not un-append: the record is written whole, or not at all.
        """
        return await self._submit(episode, None)

    async def append_frames(self, frames: Sequence[Buffer]) -> RecordRef:
        """Persist an episode already encoded as frames (``encode_frames``), as they are.

        Only the header is decoded (lightly, for the index row); the buffers are written
        unchanged. They must stay unchanged until this returns.
        """
        return await self._submit(None, frames)

    async def flush(self) -> None:
        """Wait until everything appended or journaled so far is durable and indexed."""
        writer = self._need_writer()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()

        def resolve(exc: BaseException | None) -> None:
            if not fut.done():
                fut.set_exception(exc) if exc else fut.set_result(None)

        def done(_ref: RecordRef | None, exc: BaseException | None) -> None:
            try:
                loop.call_soon_threadsafe(resolve, exc)
            except RuntimeError:
                pass

        writer.q.put(FlushItem(done))
        await fut

    def journal(self, episode: Episode) -> Journal:
        """Journal ``episode``'s deltas on every ``notify()`` until it is appended."""
        writer = self._need_writer()
        old = self._journals.get(episode.id)
        if old is not None and not old.closed:
            return old
        path = self.layout.journal(episode.id)

        def submit(item: JournalItem) -> None:
            writer.q.put(item)

        j = Journal(episode, path, submit)
        self._journals[episode.id] = j
        return j

    async def close(self, status: RunStatus | str = RunStatus.COMPLETE) -> None:
        """Finish pending writes, record ``status`` (complete/interrupted) and release
        the run. Journals still open stay on disk (recovered as incomplete on reopen)."""
        if self._closed:
            return
        writer = self._writer
        if writer is not None:
            for j in self._journals.values():
                j.close()
            self._journals.clear()
            try:
                if writer.fatal is None:
                    await self.flush()
            finally:
                writer.stop()
                await asyncio.to_thread(writer.join)
                meta = {**self._meta, "status": RunStatus(status).value, "ended": time.time()}
                try:
                    await asyncio.to_thread(write_meta, self.layout, meta)
                    self._meta = meta
                finally:
                    await asyncio.to_thread(self._release, seal=writer.fatal is None)
        else:
            self._release()

    def _release(self, seal: bool = False) -> None:
        self._closed = True
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self._conn.close()
        if self._lock is not None:
            try:
                if seal:
                    # Still holding the lock, every connection of ours closed: fold the
                    # WAL in, so the closed run is index.sqlite alone.
                    seal_index(self.layout)
            finally:
                self._lock.release()
                self._lock = None

    async def __aenter__(self) -> Run:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close(RunStatus.COMPLETE if et is None else RunStatus.INTERRUPTED)

    def __enter__(self) -> Run:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._writer is None:
            self._release()

    # -- reading ----------------------------------------------------------------------------
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
        for i in range(0, len(seqs), 500):
            chunk = [int(s) for s in seqs[i : i + 500]]
            marks = ", ".join("?" for _ in chunk)
            out += self._checked(f" WHERE seq IN ({marks})", chunk, cols)
        return out

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

    def live(self) -> list[Episode]:
        """In-flight episodes assembled from their journals (those not yet appended), each
        with its latest ``pending`` messages.

        Incremental: per journal, only the bytes appended since the previous call are read
        and applied to the episode assembled then, so a returned episode is the same object
        on the next call, grown in place (lists and columns only grow; a restarted trace is
        replaced). Journals that disappeared or whose episode is indexed are forgotten.
        """
        with self._tails_lock:
            paths = self.layout.journals()
            present = set(paths)
            for gone in [p for p in self._tails if p not in present]:
                del self._tails[gone]
            polled: list[JournalTail] = []
            for path in paths:
                tail = self._tails.get(path)
                if tail is None:
                    tail = self._tails[path] = JournalTail(path)
                if not tail.poll():
                    del self._tails[path]
                elif tail.episode is not None:
                    polled.append(tail)
            ids = [t.episode.id for t in polled if t.episode is not None]
            done = self._indexed(ids)
            out = []
            for tail in polled:
                ep = tail.episode
                assert ep is not None
                if ep.id in done:  # appended; its journal is about to be deleted
                    del self._tails[tail.path]
                else:
                    out.append(ep)
            return out

    def _indexed(self, episode_ids: list[str]) -> set[str]:
        """Which of ``episode_ids`` have an index row (one query per 500 ids)."""
        found: set[str] = set()
        for i in range(0, len(episode_ids), 500):
            chunk = episode_ids[i : i + 500]
            marks = ", ".join("?" for _ in chunk)
            rows = self._query(f"SELECT episode_id FROM episodes WHERE episode_id IN ({marks})",
                               chunk)
            found.update(str(r[0]) for r in rows)
        return found


def _prepare_writer(
    layout: Layout, config: dict[str, Any], fsync: str, segment_bytes: int, resume: bool
) -> tuple[dict[str, Any], WriterLock]:
    try:
        layout.root.mkdir(parents=True, exist_ok=True)
        lock = layout.try_lock()
    except OSError as exc:
        raise store_error(f"cannot create run {layout.root}", exc) from exc
    if lock is None:
        raise StoreError(errno.EBUSY, f"run {layout.root} already has a live writer")
    try:
        if layout.meta.exists():
            if not resume:
                raise StoreError(errno.EEXIST, f"{layout.root} already holds a run (resume it)")
            recover(layout)
            meta = read_meta(layout)
            meta = {**meta, "status": RunStatus.RUNNING.value, "resumed": time.time(),
                    "ended": None}
            if config:
                meta["config"] = {**meta.get("config", {}), **config}
        else:
            meta = new_meta(layout.root.name, config, fsync, segment_bytes)
        try:
            layout.live.mkdir(exist_ok=True)
            layout.segments.mkdir(exist_ok=True)
        except OSError as exc:
            raise store_error(f"cannot create run {layout.root}", exc) from exc
        write_meta(layout, meta)
        connect(layout, write=True).close()
    except BaseException:
        lock.release()
        raise
    return meta, lock


def open_run(path: str | os.PathLike[str]) -> Run:
    """Open a run directory for reading; changes nothing on disk (see :meth:`Run.open`)."""
    return Run.open(path)


def remove_run(path: str | os.PathLike[str]) -> None:
    """Delete a run directory (refuses while a writer holds it)."""
    layout = Layout(path)
    try:
        lock = layout.try_lock()
    except OSError as exc:
        raise store_error(f"cannot remove run {path}", exc) from exc
    if lock is None:
        raise StoreError(errno.EBUSY, f"run {path} has a live writer")
    lock.release()
    shutil.rmtree(layout.root)
