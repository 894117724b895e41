"""Opening a run directory: the index connection, and recovery after a crash.

Recovery runs only while holding the writer lock (so never under a live writer): it
indexes records the index lacks, truncates torn segment tails, and turns journals of
episodes that were never appended into stored episodes with status "incomplete".
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from typing import Any

from ._encode import episode_parts
from ._journal import read_journal
from ._layout import Layout, fsync_dir, read_meta, store_error, write_meta
from ._schema import (
    INDEX_VERSION,
    RecordRef,
    create_sql,
    insert_sql,
    record_parts_info,
    row_from_header,
)
from ._segments import recover_segments, write_parts
from ._status import RunStatus

__all__ = ["connect", "recover"]

log = logging.getLogger("tracewire.store")


def connect(layout: Layout, *, write: bool) -> sqlite3.Connection:
    """A connection to the index (WAL); the writer's creates the schema."""
    try:
        conn = sqlite3.connect(layout.index, check_same_thread=False, timeout=30.0)
        conn.execute("PRAGMA busy_timeout = 30000")
        if write:
            conn.execute("PRAGMA journal_mode = WAL")
            # Rows can always be rebuilt from the segments, so NORMAL is enough here.
            conn.execute("PRAGMA synchronous = NORMAL")
            with conn:
                for stmt in create_sql():
                    conn.execute(stmt)
                (version,) = conn.execute("PRAGMA user_version").fetchone()
                if version == 0:
                    conn.execute(f"PRAGMA user_version = {INDEX_VERSION}")
        else:
            conn.isolation_level = None  # autocommit: every query sees the latest commit
            conn.execute("PRAGMA query_only = 1")
        return conn
    except sqlite3.Error as exc:
        raise store_error(f"cannot open index {layout.index}", exc) from exc


def _store_incomplete(layout: Layout, conn: sqlite3.Connection, parts: list[Any]) -> None:
    nums = layout.segment_numbers()
    layout.segments.mkdir(parents=True, exist_ok=True)
    seg = nums[-1] if nums else 0
    path = layout.segment(seg)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        start = os.lseek(fd, 0, os.SEEK_END)
        write_parts(fd, parts, start)
        os.fdatasync(fd)
    finally:
        os.close(fd)
    if not nums:
        fsync_dir(layout.segments)
    total, _, _, hcrc = record_parts_info(memoryview(parts[0]))
    row = row_from_header(parts[2], RecordRef(seg, start, total, hcrc), time.time())
    with conn:
        conn.execute(insert_sql(), row.values())


def recover(layout: Layout) -> dict[str, int]:
    """Bring a run directory whose writer is gone to a consistent state (caller holds the
    lock). Returns counts of what was done."""
    read_meta(layout)  # refuse anything that is not a run
    conn = connect(layout, write=True)
    try:
        with conn:
            added, cut = recover_segments(layout, conn)
        recovered = dropped = 0
        for path in layout.journals():
            ep = read_journal(path)
            if ep is not None:
                (known,) = conn.execute(
                    "SELECT COUNT(*) FROM episodes WHERE episode_id = ?", (ep.id,)
                ).fetchone()
                if not known:
                    ep.info = {**ep.info, "incomplete": True}
                    _store_incomplete(layout, conn, episode_parts(ep, lambda: None))
                    recovered += 1
                else:
                    dropped += 1
            path.unlink()
    except sqlite3.Error as exc:
        raise store_error("cannot recover the index", exc) from exc
    except OSError as exc:
        raise store_error(f"cannot recover {layout.root}", exc) from exc
    finally:
        conn.close()
    meta = read_meta(layout)
    if meta.get("status") == RunStatus.RUNNING:
        meta = {**meta, "status": RunStatus.INTERRUPTED.value, "recovered": time.time()}
        write_meta(layout, meta)
    stats = {"rows_added": added, "bytes_truncated": cut, "journals_recovered": recovered,
             "journals_dropped": dropped}
    if any(stats.values()):
        log.info("recovered %s: %s", layout.root, stats)
    return stats
