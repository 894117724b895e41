"""Segment files: whole-record writes, verified reads, and recovery of a torn tail.

A segment is a plain concatenation of self-checking records (``tracewire.codec`` record
framing). Writes go through ``os.writev`` from the record's parts; a failed write is cut
back so no partial record stays behind. Recovery scans only what the index does not cover.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import sqlite3
import time
from collections.abc import Callable, Sequence

from .._errors import CorruptRecordError, DecodeError
from ..codec import RECORD_PREFIX, decode_record, record_length
from ._layout import Layout
from ._schema import IndexRow, RecordRef, record_parts_info, row_from_header

__all__ = ["WRITE_SLICE", "read_record", "recover_segments", "write_parts"]

log = logging.getLogger("tracewire.store")
Buffer = bytes | bytearray | memoryview
_IOV_MAX = 512
#: Bytes per ``writev`` call of :func:`write_parts` (~0.1–1 ms each).
WRITE_SLICE = 1 << 19
_MAGIC = b"TWR1"


def write_parts(
    fd: int,
    parts: Sequence[Buffer],
    start: int,
    pause: Callable[[], None] | None = None,
    max_write: int = WRITE_SLICE,
    flush: bool = False,
) -> int:
    """Write ``parts`` at the end of ``fd`` (which is at ``start``); returns bytes written.

    Each ``writev`` carries at most ``max_write`` bytes and ``pause()`` runs between them:
    a write into the page cache releases the GIL but holds the CPU (and allocating page
    cache pages can cost ~2 ms per MB on a VM), so one huge write could delay the event
    loop by a whole scheduler tick. On any ``OSError`` the file is truncated back to
    ``start`` before re-raising, so a failed write never leaves a partial record.
    With ``flush`` the write-back of each slice starts at once (:func:`start_writeback`),
    so a later ``fdatasync`` finds little left to do instead of submitting the whole
    record in one long, non-preemptible system call.
    """
    views = [v for p in parts if (v := memoryview(p).cast("B")).nbytes]
    written = 0
    try:
        i = 0
        while i < len(views):
            batch: list[memoryview] = []
            size = 0
            for v in views[i : i + _IOV_MAX]:
                if size + v.nbytes > max_write:
                    if not batch:  # one big part: its first slice alone
                        batch.append(v[:max_write])
                    break
                batch.append(v)
                size += v.nbytes
            n = os.writev(fd, batch)
            if flush:
                start_writeback(fd, start + written, n)
            written += n
            # Skip whole parts written; keep the unwritten rest of a partly written one.
            while i < len(views) and n >= views[i].nbytes:
                n -= views[i].nbytes
                i += 1
            if n:
                views[i] = views[i][n:]
            if pause is not None and i < len(views):
                pause()
    except OSError:
        try:
            os.ftruncate(fd, start)
            os.lseek(fd, start, os.SEEK_SET)
        except OSError:
            log.exception("cannot cut a failed write back to offset %d", start)
        raise
    return written


_libc: ctypes.CDLL | None
try:
    _libc = ctypes.CDLL(None, use_errno=True)
    _sync_file_range = _libc.sync_file_range
    _sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    _sync_file_range.restype = ctypes.c_int
except (OSError, AttributeError):  # not Linux/glibc: leave write-back to the kernel
    _libc = None
_SYNC_FILE_RANGE_WRITE = 2


def start_writeback(fd: int, offset: int, nbytes: int) -> None:
    """Start (not wait for) write-back of a byte range: ``sync_file_range(WRITE)`` on Linux,
    nothing elsewhere. Errors are ignored: the later ``fdatasync`` reports real ones."""
    if _libc is not None and nbytes > 0:
        _sync_file_range(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE)


def read_record(fd: int, ref: RecordRef) -> bytes:
    """The verified bytes of the record at ``ref`` (one ``pread``)."""
    data = os.pread(fd, ref.length, ref.offset)
    if len(data) != ref.length:
        raise CorruptRecordError(
            0, f"segment {ref.segment} ends inside the record at offset {ref.offset}"
        )
    return data


def _valid_at(mm: mmap.mmap, pos: int, size: int) -> int:
    """Length of a valid record at ``pos`` or 0."""
    if size - pos < RECORD_PREFIX:
        return 0
    try:
        total = record_length(mm[pos : pos + RECORD_PREFIX])
        if pos + total > size:
            return 0
        decode_record(memoryview(mm)[pos : pos + total], verify=True)
    except DecodeError:
        return 0
    except Exception:
        return 0
    return total


def _scan(path: os.PathLike[str] | str, seg: int, start: int) -> tuple[list[IndexRow], int]:
    """Rows of valid records from ``start`` on, and the offset where valid data ends."""
    rows: list[IndexRow] = []
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size <= start:
            return rows, min(start, size)
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            pos = end = start
            while pos < size:
                n = _valid_at(mm, pos, size)
                if n == 0:
                    # Bad bytes: look for a later valid record (damage in the middle must
                    # not cost the records after it); none means a torn tail.
                    nxt = mm.find(_MAGIC, pos + 1)
                    while nxt != -1 and not _valid_at(mm, nxt, size):
                        nxt = mm.find(_MAGIC, nxt + 1)
                    if nxt == -1:
                        break
                    log.warning("segment %d: skipping %d bad bytes at %d", seg, nxt - pos, pos)
                    pos = nxt
                    continue
                rec = memoryview(mm)[pos : pos + n]
                _total, hoff, hlen, hcrc = record_parts_info(rec)
                ref = RecordRef(seg, pos, n, hcrc)
                try:
                    rows.append(row_from_header(bytes(rec[hoff : hoff + hlen]), ref, time.time()))
                except DecodeError:
                    log.warning("segment %d: record at %d is not an episode; skipped", seg, pos)
                rec.release()
                pos = end = pos + n
        finally:
            mm.close()
    return rows, end


def recover_segments(layout: Layout, conn: sqlite3.Connection) -> tuple[int, int]:
    """Index records the index lacks, drop rows pointing past a file's end, truncate torn
    tails. Returns ``(rows_added, bytes_truncated)``. Caller holds the writer lock."""
    from ._schema import insert_sql

    added = cut = 0
    for seg in layout.segment_numbers():
        path = layout.segment(seg)
        size = path.stat().st_size
        conn.execute(
            'DELETE FROM episodes WHERE segment = ? AND "offset" + length > ?', (seg, size)
        )
        (covered,) = conn.execute(
            'SELECT COALESCE(MAX("offset" + length), 0) FROM episodes WHERE segment = ?', (seg,)
        ).fetchone()
        rows, end = _scan(path, seg, int(covered))
        for row in rows:
            conn.execute(insert_sql(), row.values())
        added += len(rows)
        if end < size:
            with open(path, "r+b") as f:
                f.truncate(end)
                os.fsync(f.fileno())
            log.warning("segment %d: truncated a torn tail of %d bytes", seg, size - end)
            cut += size - end
    return added, cut
