"""The writer thread: encodes, writes, syncs and indexes, in arrival order, off the loop.

The event loop only puts an item on a queue and awaits a future; this thread does the
encoding (in GIL-friendly slices), the CRCs, ``writev``, ``fdatasync`` (group commit) and the
index rows, then resolves the futures with ``loop.call_soon_threadsafe``. An index row is
inserted only after its record's bytes are flushed (and synced, unless fsync is "never").

Keeping the loop's lag low is this thread's job: every long step is cut into slices
(≤ 256 items per msgspec call, ≤ 1 MiB per CRC call, ≤ 512 KiB per ``writev``, a pause every
512 calls while building the index row) and ``_encode.yield_gil`` runs between slices; when
a sync follows, write-back of each slice starts right after it is written, so ``fdatasync``
does not submit a whole record in one long system call. The interpreter's switch interval
is left alone unless ``Run.create(switch_interval=...)`` asks for it: with the pauses
above it does not set the worst loop lag (bench/README.md has the figures).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec

from .._errors import StoreError, TracewireError
from ..codec import EpisodeDelta, encode_frames, record_info
from ..trace import Episode
from ._encode import episode_parts, record_parts, yield_gil
from ._layout import Layout, fsync_dir, store_error
from ._rows import row_from_episode, row_from_header
from ._schema import (
    IndexRow,
    RecordRef,
    insert_sql,
)
from ._segments import write_parts
from ._status import FsyncPolicy

__all__ = ["AppendItem", "FlushItem", "JournalItem", "Writer"]

log = logging.getLogger("tracewire.store")
#: What encoding an episode built with bad values raises (an int past 64 bits is an
#: OverflowError): that append fails with a StoreError, the writer goes on.
_BAD_INPUT = (OSError, ValueError, TypeError, ArithmeticError, msgspec.EncodeError)
Buffer = bytes | bytearray | memoryview
#: Called in the writer thread with the outcome of one item.
Done = Callable[[RecordRef | None, BaseException | None], None]
_MAX_BATCH = 256


#: How much nicer than the rest of the process the writer thread runs (Linux: per thread).
WRITER_NICE = 10


def _lower_priority() -> None:
    """Make the calling (writer) thread yield the CPU to the event loop's thread.

    On two busy cores the loop thread, woken by a timer, otherwise waits for the scheduler
    behind this thread's copies into the page cache. Raising a thread's niceness needs no
    privilege; where it is not supported the thread keeps the default priority.
    """
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + WRITER_NICE)
    except (AttributeError, OSError):
        pass


@dataclasses.dataclass(slots=True)
class AppendItem:
    """Persist one episode (live object, or frames already encoded)."""

    episode: Episode | None
    frames: Sequence[Buffer] | None
    done: Done
    journal: Path | None = None


@dataclasses.dataclass(slots=True)
class JournalItem:
    """Append one delta to an episode's journal (``delta`` None: create the empty file)."""

    path: Path
    delta: EpisodeDelta | None
    on_error: Callable[[BaseException], None]


@dataclasses.dataclass(slots=True)
class FlushItem:
    """Barrier: resolved once everything queued before it is durable and indexed."""

    done: Done


class _Stop:
    pass


class Writer(threading.Thread):
    """One writer thread per open run."""

    def __init__(
        self,
        layout: Layout,
        *,
        fsync: FsyncPolicy,
        interval: float,
        segment_bytes: int,
        conn_factory: Callable[[], sqlite3.Connection],
        switch_interval: float | None = None,
    ) -> None:
        super().__init__(name=f"tracewire-store:{layout.root.name}", daemon=True)
        self.layout = layout
        self.fsync = fsync
        self.interval = interval
        self.segment_bytes = segment_bytes
        self.switch_interval = switch_interval
        self._conn_factory = conn_factory
        self.q: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.fatal: BaseException | None = None
        self._seg = -1
        self._fd = -1
        self._size = 0
        self._dirty: set[int] = set()
        self._journals: dict[Path, int] = {}
        self._pending: list[tuple[IndexRow | None, Done, Path | None]] = []
        self._last_sync = 0.0

    # -- thread main ------------------------------------------------------------------------
    def run(self) -> None:
        # Opt-in only: a library should not change a process-wide setting by default.
        si = self.switch_interval
        if si is not None and sys.getswitchinterval() > si:
            sys.setswitchinterval(si)
        _lower_priority()
        try:
            self._conn = self._conn_factory()
            self._open_last_segment()
        except BaseException as exc:
            self.fatal = store_error("cannot open the run for writing", exc)
            self._drain_failing()
            return
        try:
            self._loop()
        except BaseException as exc:  # a bug: fail everything rather than hang callers
            log.exception("store writer crashed")
            self.fatal = store_error("store writer crashed", exc)
            self._fail_pending(self.fatal)
            self._drain_failing()
        finally:
            self._close_files()

    def _loop(self) -> None:
        q = self.q
        while True:
            try:
                item = q.get_nowait()
            except queue.Empty:
                if not self._pending:
                    item = q.get()
                elif self.fsync != FsyncPolicy.INTERVAL:
                    self._commit()
                    continue
                else:
                    wait = self._last_sync + self.interval - time.monotonic()
                    if wait <= 0:
                        self._commit()
                        continue
                    try:
                        item = q.get(timeout=wait)
                    except queue.Empty:
                        self._commit()
                        continue
            if isinstance(item, _Stop):
                self._commit()
                return
            try:
                self._handle(item)
            except BaseException as exc:
                # A bug: the item in hand fails too (the crash handler fails the rest).
                if isinstance(item, AppendItem | FlushItem):
                    item.done(None, store_error("store writer crashed", exc))
                raise
            if len(self._pending) >= _MAX_BATCH or (
                self.fsync == FsyncPolicy.INTERVAL
                and self._pending
                and time.monotonic() - self._last_sync >= self.interval
                and not q.empty()
            ):
                self._commit()

    def _drain_failing(self) -> None:
        err = self.fatal or StoreError(0, "store writer stopped")
        while True:
            item = self.q.get()
            if isinstance(item, _Stop):
                return
            if isinstance(item, AppendItem | FlushItem):
                item.done(None, err)

    def stop(self) -> None:
        """Ask the thread to finish what is queued and exit."""
        self.q.put(_Stop())

    # -- items ------------------------------------------------------------------------------
    def _handle(self, item: Any) -> None:
        if isinstance(item, AppendItem):
            self._append(item)
        elif isinstance(item, JournalItem):
            self._journal(item)
        elif isinstance(item, FlushItem):
            self._pending.append((None, item.done, None))

    def _append(self, item: AppendItem) -> None:
        try:
            if item.episode is not None:
                parts = episode_parts(item.episode)
            else:
                assert item.frames is not None
                parts = record_parts(item.frames)
            prefix = memoryview(parts[0])
            info = record_info(prefix)
            total, hcrc = info.total, info.header_crc
            if item.episode is not None:
                row = row_from_episode(item.episode, RecordRef(0, 0, 0, 0), 0.0, yield_gil)
            else:  # parts: prefix, buffer table, header, buffers...
                row = row_from_header(parts[2], RecordRef(0, 0, 0, 0), 0.0)
            if self._size and self._size + total > self.segment_bytes:
                self._roll()
            start = self._size
            try:
                write_parts(self._fd, parts, start, yield_gil,
                            flush=self.fsync != FsyncPolicy.NEVER)
            except OSError as exc:
                raise store_error(f"cannot write segment {self._seg}", exc) from exc
            self._size += total
            self._dirty.add(self._fd)
            row = dataclasses.replace(
                row, segment=self._seg, offset=start, length=total, crc=hcrc, written=time.time()
            )
            self._pending.append((row, item.done, item.journal))
        except TracewireError as exc:
            item.done(None, exc)
        except _BAD_INPUT as exc:
            item.done(None, store_error("cannot store the episode", exc))

    def _journal(self, item: JournalItem) -> None:
        fd = self._journals.get(item.path)
        try:
            if fd is None:
                item.path.parent.mkdir(exist_ok=True)
                fd = os.open(item.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                self._journals[item.path] = fd
            if item.delta is not None:
                start = os.fstat(fd).st_size
                write_parts(fd, record_parts(encode_frames(item.delta)), start, yield_gil)
                self._dirty.add(fd)
        except _BAD_INPUT as exc:
            item.on_error(store_error(f"cannot write journal {item.path.name}", exc))

    # -- commit -----------------------------------------------------------------------------
    def _commit(self) -> None:
        pending, self._pending = self._pending, []
        err: BaseException | None = None
        try:
            if self.fsync != FsyncPolicy.NEVER:
                for fd in self._dirty:
                    os.fdatasync(fd)
            self._dirty.clear()
        except OSError as exc:
            err = store_error("cannot sync the run to disk", exc)
        self._last_sync = time.monotonic()
        rows = [p[0] for p in pending if p[0] is not None]
        if err is None and rows:
            try:
                with self._conn:
                    self._conn.executemany(insert_sql(), [r.stored() for r in rows])
            except (sqlite3.Error, OSError) as exc:
                err = store_error("cannot write the index", exc)
        for row, done, journal in pending:
            if err is None and journal is not None:
                self._drop_journal(journal)
            done(None if row is None or err else row.ref, err)

    def _fail_pending(self, err: BaseException) -> None:
        pending, self._pending = self._pending, []
        for _, done, _ in pending:
            done(None, err)

    def _drop_journal(self, path: Path) -> None:
        fd = self._journals.pop(path, None)
        if fd is not None:
            self._dirty.discard(fd)
            os.close(fd)
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        except OSError:
            log.warning("cannot delete journal %s", path, exc_info=True)

    # -- segments ---------------------------------------------------------------------------
    def _open_last_segment(self) -> None:
        nums = self.layout.segment_numbers()
        self.layout.segments.mkdir(parents=True, exist_ok=True)
        self._open_segment(nums[-1] if nums else 0)

    def _open_segment(self, n: int) -> None:
        path = self.layout.segment(n)
        created = not path.exists()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        self._size = os.lseek(fd, 0, os.SEEK_END)
        self._seg, self._fd = n, fd
        if created and self.fsync != FsyncPolicy.NEVER:
            fsync_dir(self.layout.segments)

    def _roll(self) -> None:
        old = self._fd
        if self.fsync != FsyncPolicy.NEVER and old in self._dirty:
            os.fdatasync(old)
        self._dirty.discard(old)
        os.close(old)
        self._open_segment(self._seg + 1)

    def _close_files(self) -> None:
        for fd in [self._fd, *self._journals.values()]:
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._journals.clear()
        conn = getattr(self, "_conn", None)
        if conn is not None:
            conn.close()
