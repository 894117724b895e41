"""Segment files: whole-record writes, verified reads, scans, and recovery of a torn tail.

A segment is a plain concatenation of self-checking records (``tracewire.codec`` record
framing). Writes go through ``os.writev`` from the record's parts; a failed write is cut
back so no partial record stays behind. A scan tells intact records (framing and CRCs hold,
whether or not this build can decode them) from damaged bytes; recovery (writers only)
scans only what the index does not cover and truncates only a tail that is not an intact
record.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from .._errors import CorruptRecordError, DecodeError
from ..codec import RECORD_MAGIC, RECORD_PREFIX, RecordInfo, record_info, verify_record
from ._layout import Layout
from ._rows import row_from_header
from ._schema import IndexRow, RecordRef, insert_sql

__all__ = ["WRITE_SLICE", "Piece", "read_record", "recover_segments", "walk", "write_parts"]

log = logging.getLogger("tracewire.store")
Buffer = bytes | bytearray | memoryview
_IOV_MAX = 512
#: Bytes per ``writev`` call of :func:`write_parts` (~0.1–1 ms each).
WRITE_SLICE = 1 << 19


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
    """The bytes of the record at ``ref`` (one ``pread``); its prefix must name the length
    and header CRC the index holds, so a damaged index row never reads another record."""
    data = os.pread(fd, ref.length, ref.offset)
    if len(data) != ref.length:
        raise CorruptRecordError(
            0, f"segment {ref.segment} ends inside the record at offset {ref.offset}"
        )
    try:
        info = record_info(data)
    except DecodeError as exc:
        raise CorruptRecordError(
            0, f"no record at segment {ref.segment} offset {ref.offset}: {exc}"
        ) from exc
    if info.total != ref.length or info.header_crc != ref.crc:
        raise CorruptRecordError(
            0, f"the index row for segment {ref.segment} offset {ref.offset} does not match "
            "the record there (damaged index: run `tracewire check --repair`)"
        )
    return data


@dataclass(frozen=True, slots=True)
class Piece:
    """A stretch of a segment: an intact record (``info`` set) or bytes that form none."""

    offset: int
    length: int
    info: RecordInfo | None

    @property
    def intact(self) -> bool:
        """True for a record whose framing and CRCs hold."""
        return self.info is not None


def _intact_at(mm: mmap.mmap, pos: int, size: int) -> RecordInfo | None:
    """The record at ``pos`` if its framing and CRCs hold (not decoded), else None."""
    if size - pos < RECORD_PREFIX:
        return None
    try:
        info = record_info(mm[pos : pos + RECORD_PREFIX])
        if pos + info.total > size:
            return None
        with memoryview(mm) as mv:
            return verify_record(mv[pos : pos + info.total])
    except DecodeError:
        return None


def walk(mm: mmap.mmap, start: int = 0) -> Iterator[Piece]:
    """The pieces of a segment from ``start`` on: intact records, and the damaged bytes
    between them (a run up to the next intact record, or to the end: a torn tail)."""
    size = len(mm)
    pos = start
    while pos < size:
        info = _intact_at(mm, pos, size)
        if info is not None:
            yield Piece(pos, info.total, info)
            pos += info.total
            continue
        # Bad bytes: look for a later intact record (damage in the middle must not cost
        # the records after it); none means everything to the end is a torn tail.
        nxt = mm.find(RECORD_MAGIC, pos + 1)
        while nxt != -1 and _intact_at(mm, nxt, size) is None:
            nxt = mm.find(RECORD_MAGIC, nxt + 1)
        end = size if nxt == -1 else nxt
        yield Piece(pos, end - pos, None)
        pos = end


def map_segment(path: os.PathLike[str] | str) -> mmap.mmap | None:
    """A read-only map of a segment file (None when empty)."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return None
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


def _scan(path: os.PathLike[str] | str, seg: int, start: int) -> tuple[list[IndexRow], int]:
    """Rows of intact records from ``start`` on, and the offset where intact data ends."""
    rows: list[IndexRow] = []
    mm = map_segment(path)
    if mm is None:
        return rows, 0
    try:
        if len(mm) <= start:
            return rows, min(start, len(mm))
        end = start
        for piece in walk(mm, start):
            if piece.info is None:
                log.warning("segment %d: %d damaged bytes at %d", seg, piece.length,
                            piece.offset)
                continue
            end = piece.offset + piece.length
            info = piece.info
            ref = RecordRef(seg, piece.offset, info.total, info.header_crc)
            hoff = piece.offset + info.header_offset
            try:
                rows.append(row_from_header(mm[hoff : hoff + info.header_len], ref, time.time()))
            except DecodeError as exc:
                # Intact but not decodable here (newer schema, buggy writer): kept as it is.
                log.warning("segment %d: intact record at %d is not indexed (%s); kept",
                            seg, piece.offset, exc)
    finally:
        mm.close()
    return rows, end


def recover_segments(layout: Layout, conn: sqlite3.Connection) -> tuple[int, int]:
    """Index records the index lacks, drop rows pointing past a file's end, truncate a torn
    tail (only bytes after the last intact record). Returns ``(rows_added,
    bytes_truncated)``. Writers only: the caller holds the writer lock."""
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
            conn.execute(insert_sql(), row.stored())
        added += len(rows)
        if end < size:
            with open(path, "r+b") as f:
                f.truncate(end)
                os.fsync(f.fileno())
            log.warning("segment %d: truncated a torn tail of %d bytes", seg, size - end)
            cut += size - end
    return added, cut
