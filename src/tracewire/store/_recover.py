"""Opening a run directory: the index connection, and recovery after a crash.

Readers never change a file: they open the index read-only (``mode=ro``; on a read-only
directory or mount, where SQLite cannot create the WAL's shared-memory file, as
``immutable``) and report problems (``RunReader.verify``) instead of repairing them. A run closed
cleanly is not in WAL mode at all (:func:`seal_index`), so its ``index.sqlite`` alone holds
every row wherever it is copied. Recovery runs
only in a writer (``Run.create(resume=True)``) or in a repair a person asks for
(``tracewire check --repair``), always holding the writer lock: it indexes records the index
lacks, truncates a torn segment tail, and turns journals of episodes that were never
appended into stored episodes with status "incomplete".
"""


from __future__ import annotations

import logging
import os
import sqlite3
import time
from typing import Any

from ..codec import record_info
from ..trace import InfoKey
from ._encode import episode_parts
from ._journal import read_journal
from ._layout import Layout, fsync_dir, read_meta, store_error, write_meta
from ._rows import row_from_header
from ._schema import (
    COLUMNS,
    INDEX_VERSION,
    ROW_CRC,
    RecordRef,
    add_columns_sql,
    create_sql,
    insert_sql,
    row_crc,
    select_list,
)
from ._segments import recover_segments, write_parts
from ._status import RunStatus

__all__ = ["columns_of", "connect", "fetch_all", "recover", "seal_index"]

log = logging.getLogger("tracewire.store")


def connect(layout: Layout, *, write: bool) -> sqlite3.Connection:
    """A connection to the index (WAL); the writer's creates (or extends) the schema.

    A reader's is read-only; a run without an index yet reads as empty (an in-memory
    table), so opening it creates nothing.
    """
    try:
        if write:
            return _connect_writer(layout)
        conn = _connect_reader(layout)
        conn.isolation_level = None  # autocommit: every query sees the latest commit
        conn.execute("PRAGMA query_only = 1")
        return conn
    except sqlite3.Error as exc:
        raise store_error(f"cannot open index {layout.index}", exc) from exc


def _connect_writer(layout: Layout) -> sqlite3.Connection:
    conn = sqlite3.connect(layout.index, check_same_thread=False, timeout=30.0)
    conn.execute("PRAGMA busy_timeout = 30000")
    conn.execute("PRAGMA journal_mode = WAL")
    # Rows can always be rebuilt from the segments, so NORMAL is enough here.
    conn.execute("PRAGMA synchronous = NORMAL")
    with conn:
        for stmt in create_sql():
            conn.execute(stmt)
        present = columns_of(conn)
        for stmt in add_columns_sql(present):
            conn.execute(stmt)
        if ROW_CRC not in present:
            _backfill_checksums(conn, present)
        (version,) = conn.execute("PRAGMA user_version").fetchone()
        if version == 0:
            conn.execute(f"PRAGMA user_version = {INDEX_VERSION}")
    return conn


def _backfill_checksums(conn: sqlite3.Connection, present: list[str]) -> None:
    # An index from a build without row_crc: checksum its rows as they stand, so from now
    # on a row without one is damage (``tracewire check`` still compares rows to records).
    select = select_list(present, ["seq", *COLUMNS])
    rows = conn.execute(f"SELECT {select} FROM episodes").fetchall()
    conn.executemany(f'UPDATE episodes SET "{ROW_CRC}" = ? WHERE seq = ?',
                     [(row_crc(r[1:]), r[0]) for r in rows])


def seal_index(layout: Layout) -> bool:
    """Fold the WAL into ``index.sqlite`` and leave WAL mode, so a closed run is one
    self-contained file (no ``-wal``/``-shm``); the caller holds the writer lock and has
    closed its own connections. False when another process still holds the index open:
    then the WAL is only checkpointed (and emptied, unless a reader is mid-query)."""
    if not layout.index.exists():
        return True
    try:
        conn = sqlite3.connect(layout.index, timeout=2.0)
        try:
            conn.execute("PRAGMA busy_timeout = 2000")
            busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            (mode,) = conn.execute("PRAGMA journal_mode = DELETE").fetchone()
        finally:
            conn.close()
    except sqlite3.Error as exc:
        log.warning("%s: cannot fold the index's WAL in: %s", layout.root, exc)
        return False
    if mode != "delete":
        log.info("%s: index left in WAL mode (a reader holds it%s)", layout.root,
                 "; WAL not emptied" if busy else "")
    return bool(mode == "delete")


def _connect_reader(layout: Layout) -> sqlite3.Connection:
    if not layout.index.exists():
        conn = sqlite3.connect(":memory:", check_same_thread=False)
        for stmt in create_sql():
            conn.execute(stmt)
        return conn
    uri = layout.index.resolve().as_uri()
    try:
        conn = sqlite3.connect(f"{uri}?mode=ro", uri=True, check_same_thread=False,
                               timeout=30.0)
        conn.execute("PRAGMA busy_timeout = 30000")
        conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
        return conn
    except sqlite3.OperationalError:
        if os.access(layout.root, os.W_OK) and os.access(layout.index, os.W_OK):
            raise
    # A read-only directory or mount: SQLite cannot create the WAL's shared-memory file
    # there, and no writer can be appending through it, so the file is read as it is.
    conn = sqlite3.connect(f"{uri}?immutable=1", uri=True, check_same_thread=False)
    conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
    return conn


def _lossy_text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


def fetch_all(conn: sqlite3.Connection, sql: str, args: Any = ()) -> list[tuple[Any, ...]]:
    """``conn.execute(sql, args).fetchall()``; a TEXT value that is not UTF-8 (a damaged
    byte) is read with replacement characters, so its row fails its checksum (and is
    named) instead of failing the whole query."""
    try:
        return conn.execute(sql, args).fetchall()
    except sqlite3.OperationalError as exc:
        if "decode" not in str(exc):
            raise
    conn.text_factory = _lossy_text
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.text_factory = str


def columns_of(conn: sqlite3.Connection) -> list[str]:
    """Column names of the index table (empty when it does not exist)."""
    return [str(r[1]) for r in conn.execute("PRAGMA table_info(episodes)").fetchall()]


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
    info = record_info(parts[0])
    row = row_from_header(parts[2], RecordRef(seg, start, info.total, info.header_crc),
                          time.time())
    with conn:
        conn.execute(insert_sql(), row.stored())


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
                    ep.info = {**ep.info, InfoKey.INCOMPLETE: True}
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
