"""Segment files: whole-record writes, verified reads, and recovery of a torn tail.

A segment is a plain concatenation of self-checking records (``tracewire.codec`` record
framing). Writes go through ``os.writev`` from the record's parts; a failed write is cut
back so no partial record stays behind. Recovery scans only what the index does not cover.
"""

from __future__ import annotations

import logging
import mmap
import os
import sqlite3
import time
from collections.abc import Sequence

from .._errors import CorruptRecordError, DecodeError
from ..codec import RECORD_PREFIX, decode_record, record_length
from ._layout import Layout
from ._schema import IndexRow, RecordRef, record_parts_info, row_from_header

__all__ = ["read_record", "recover_segments", "write_parts"]

log = logging.getLogger("tracewire.store")
Buffer = bytes | bytearray | memoryview
_IOV_MAX = 512
_MAGIC = b"TWR1"


def write_parts(fd: int, parts: Sequence[Buffer], start: int) -> int:
    """Write ``parts`` at the end of ``fd`` (which is at ``start``); returns bytes written.

    On any ``OSError`` the file is truncated back to ``start`` before re-raising, so a
    failed write never leaves a partial record.
    """
    views = [memoryview(p).cast("B") for p in parts if memoryview(p).nbytes]
    written = 0
    try:
        i = 0
        while i < len(views):
            batch = views[i : i + _IOV_MAX]
            n = os.writev(fd, batch)
            written += n
            # Skip whole parts written; keep the unwritten rest of a partly written one.
            while batch and n >= batch[0].nbytes:
                n -= batch[0].nbytes
                batch.pop(0)
                i += 1
            if batch and n:
                views[i] = batch[0][n:]
    except OSError:
        try:
            os.ftruncate(fd, start)
            os.lseek(fd, start, os.SEEK_SET)
        except OSError:
            log.exception("cannot cut a failed write back to offset %d", start)
        raise
    return written


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
