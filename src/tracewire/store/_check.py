"""Checking a run against its own bytes (``RunReader.verify``) and repairing it on purpose.

A check never changes a file. It walks every segment: each intact record (framing and CRCs
hold) must decode and have the index row its header implies; bytes that form no record are
damage (a torn tail when nothing intact follows); segment numbers must have no gaps. It
also reads every index row, so a damaged row is found even when its values still parse.

A repair (``tracewire check --repair``) takes the writer lock, runs the writer's recovery
(index what is missing, truncate a torn tail, store leftover journals as incomplete), then
rewrites every index row that disagrees with its record and deletes rows that point at no
record. It never deletes an intact record, decodable or not.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import sqlite3
import time
from enum import StrEnum
from typing import Any

from .._errors import DecodeError, StoreError
from ..codec import decode_record
from ..trace import Episode
from ._layout import Layout, read_meta, store_error
from ._recover import columns_of, connect, fetch_all, recover, seal_index
from ._rows import row_from_header
from ._schema import (
    COLUMNS,
    ROW_CRC,
    IndexRow,
    RecordRef,
    insert_sql,
    rows_differ,
    select_list,
    stored_columns,
)
from ._segments import map_segment, walk
from ._status import RunStatus

__all__ = ["CheckReport", "Problem", "repair_run", "verify_run"]

log = logging.getLogger("tracewire.store")
_SEGMENT, _OFFSET, _WRITTEN = (tuple(COLUMNS).index(c) for c in ("segment", "offset", "written"))


class FixAction(StrEnum):
    """What a repair does to one index row (or to the whole index)."""

    DELETE = "delete"
    #: Rewrite the row in place (it keeps its arrival order).
    REPLACE = "replace"
    #: Index a record that has no row.
    INDEX = "index"
    #: The index cannot be read: it is moved aside and built anew.
    REBUILD = "rebuild"


@dataclasses.dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a run: its kind, where it is, what was found, and whether
    ``--repair`` can fix it (undecodable records and damage mid-segment it leaves alone)."""

    kind: str
    where: str
    detail: str
    repairable: bool

    def __str__(self) -> str:
        fix = "" if self.repairable else " [not repairable]"
        return f"{self.kind} at {self.where}: {self.detail}{fix}"


@dataclasses.dataclass(slots=True)
class CheckReport:
    """What a check found (and, after a repair, what it did)."""

    path: str
    segments: int = 0
    records: int = 0
    rows: int = 0
    problems: list[Problem] = dataclasses.field(default_factory=list)
    repaired: list[str] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when nothing is wrong."""
        return not self.problems

    def text(self) -> str:
        """A readable report, one line per problem or action."""
        head = (f"{self.path}: {self.segments} segments, {self.records} records, "
                f"{self.rows} index rows: "
                + ("OK" if self.ok else f"{len(self.problems)} problem(s)"))
        lines = [head, *(f"  {p}" for p in self.problems)]
        if self.repaired:
            lines.append("repaired:")
            lines += [f"  {a}" for a in self.repaired]
        return "\n".join(lines)


@dataclasses.dataclass(slots=True)
class _Found:
    expected: dict[tuple[int, int], IndexRow]  # (segment, offset) -> row its header implies
    ids: dict[str, tuple[int, int]]  # episode id -> its latest record


def _scan_records(layout: Layout, report: CheckReport, live: bool) -> _Found:
    found = _Found({}, {})
    nums = layout.segment_numbers()
    report.segments = len(nums)
    for want, got in zip(range(nums[-1] + 1 if nums else 0), nums, strict=False):
        if want != got:
            report.problems.append(Problem("missing segment", f"segment {want}",
                                           "segment numbers have a gap", False))
            break
    for i, seg in enumerate(nums):
        try:
            mm = map_segment(layout.segment(seg))
        except OSError as exc:
            raise store_error(f"cannot read segment {seg}", exc) from exc
        if mm is None:
            continue
        try:
            size = len(mm)
            for piece in walk(mm):
                where = f"segment {seg} offset {piece.offset}"
                info = piece.info
                if info is None:
                    tail = piece.offset + piece.length == size
                    if tail and live and i == len(nums) - 1:
                        continue  # the live writer may be writing it right now
                    kind = "torn tail" if tail else "damaged bytes"
                    report.problems.append(Problem(
                        kind, where, f"{piece.length} bytes form no intact record", tail))
                    continue
                report.records += 1
                try:
                    if not _is_episode(mm, piece.offset, piece.length):
                        continue
                except DecodeError as exc:
                    report.problems.append(Problem(
                        "undecodable record", where,
                        f"intact (CRCs hold) but this build cannot decode it: {exc}", False))
                    continue
                ref = RecordRef(seg, piece.offset, info.total, info.header_crc)
                hoff = piece.offset + info.header_offset
                row = row_from_header(mm[hoff : hoff + info.header_len], ref, 0.0)
                found.expected[(seg, piece.offset)] = row
                found.ids[row.episode_id] = (seg, piece.offset)
        finally:
            mm.close()
    return found


def _is_episode(mm: Any, offset: int, length: int) -> bool:
    """Decode the record fully (its arrays view the map, so they die before returning)."""
    obj = decode_record(mm[offset : offset + length], verify=False)
    return isinstance(obj, Episode)


def _stored_rows(conn: sqlite3.Connection) -> tuple[list[tuple[Any, ...]], bool]:
    """Every row (``seq`` then :func:`stored_columns`), and whether checksums are required
    (the index has the column)."""
    present = columns_of(conn)
    select = select_list(present, ["seq", *stored_columns()])
    rows = fetch_all(conn, f"SELECT {select} FROM episodes ORDER BY seq")
    return rows, ROW_CRC in present


def _check_rows(conn: sqlite3.Connection, found: _Found, report: CheckReport
                ) -> list[tuple[FixAction, int, IndexRow | None]]:
    """Problems of the index rows; returns the fixes: (action, seq, row to write)."""
    fixes: list[tuple[FixAction, int, IndexRow | None]] = []
    seen: set[tuple[int, int]] = set()
    raw, required = _stored_rows(conn)
    report.rows = len(raw)
    for values in raw:
        seq = int(values[0]) if isinstance(values[0], int) else -1
        try:
            row = IndexRow.from_stored(seq, values[1:], required)
        except StoreError as exc:
            fix = _refill(found, seen, seq, values[1:])
            detail = str(exc) + _shown_diff(values[1:-1], fix[2])
            report.problems.append(Problem("damaged index row", f"seq {seq}", detail, True))
            fixes.append(fix)
            continue
        key = (row.segment, row.offset)
        want = found.expected.get(key)
        if want is None:
            report.problems.append(Problem(
                "dangling index row", f"seq {seq}",
                f"episode {row.episode_id!r} points at segment {row.segment} offset "
                f"{row.offset}, where no intact episode record starts", True))
            fixes.append((FixAction.DELETE, seq, None))
            continue
        seen.add(key)
        shown = _shown_diff(values[1:-1], want)
        if shown:
            report.problems.append(Problem("wrong index row", f"seq {seq}", shown[2:], True))
            fixes.append((FixAction.REPLACE, seq, dataclasses.replace(want, written=row.written)))
    for key, want in found.expected.items():
        if key in seen or found.ids.get(want.episode_id) != key:
            continue  # indexed, or superseded by a later record of the same episode id
        report.problems.append(Problem(
            "unindexed record", f"segment {key[0]} offset {key[1]}",
            f"episode {want.episode_id!r} has no index row", True))
        fixes.append((FixAction.INDEX, -1, want))
    return fixes


def _shown_diff(values: tuple[Any, ...], want: IndexRow | None) -> str:
    """``"; col=stored (record: value), ..."`` for the columns of a row (as stored) that
    disagree with its record; empty when they agree or the row cannot be read."""
    if want is None:
        return ""
    try:
        row = IndexRow.from_sql(values)
    except StoreError:
        return ""
    diff = rows_differ(row, want)
    return "".join(f"; {c}={getattr(row, c)!r} (record: {getattr(want, c)!r})"
                   for c in diff[:4])


def _refill(found: _Found, seen: set[tuple[int, int]], seq: int, values: tuple[Any, ...]
            ) -> tuple[FixAction, int, IndexRow | None]:
    """The fix of a damaged row: rebuilt in place from the record it still points at (so it
    keeps its arrival order), else deleted (its record is then indexed anew)."""
    key = (values[_SEGMENT], values[_OFFSET])
    want = found.expected.get(key) if seq >= 0 and all(
        isinstance(k, int) and not isinstance(k, bool) for k in key) else None
    if want is None or key in seen or found.ids.get(want.episode_id) != key:
        return (FixAction.DELETE, seq, None)
    seen.add(key)
    # ``written`` (when the row was indexed) is not in the record: keep the stored one
    # unless it is not a time this row could have (then the repair's own time).
    written = values[_WRITTEN]
    now = time.time()
    ok = isinstance(written, float) and 0.0 < written <= now
    want = dataclasses.replace(want, written=written if ok else now)
    return (FixAction.REPLACE, seq, want)


def _check(layout: Layout, conn: sqlite3.Connection, report: CheckReport, live: bool
           ) -> list[tuple[FixAction, int, IndexRow | None]]:
    found = _scan_records(layout, report, live)
    try:
        (integrity,) = conn.execute("PRAGMA quick_check").fetchone()
        if integrity != "ok":
            report.problems.append(Problem("damaged index", str(layout.index),
                                           str(integrity)[:200], True))
        return _check_rows(conn, found, report)
    except sqlite3.Error as exc:
        report.problems.append(Problem("damaged index", str(layout.index), str(exc), True))
        return [(FixAction.REBUILD, -1, None)]


def verify_run(layout: Layout, conn: sqlite3.Connection, status: Any) -> CheckReport:
    """Check the run at ``layout`` through its read connection ``conn`` (read-only; see the
    module docstring); ``status`` is the run's recorded status."""
    report = CheckReport(str(layout.root))
    live = layout.writer_alive()
    _check(layout, conn, report, live)
    if not live:
        if layout.journals():
            report.problems.append(Problem(
                "unrecovered journals", str(layout.live),
                f"{len(layout.journals())} in-flight episode(s) of a writer that is gone", True))
        if status == RunStatus.RUNNING:
            report.problems.append(Problem(
                "not closed", str(layout.meta), "status is 'running' but no writer is alive",
                True))
    return report


def repair_run(path: str | os.PathLike[str]) -> CheckReport:
    """Repair the run at ``path`` (see the module docstring); returns the report of a
    check made after the repair, with the actions taken in ``repaired``."""
    layout = Layout(path)
    read_meta(layout)
    try:
        fd = layout.try_lock()
    except OSError as exc:
        raise store_error(f"cannot repair {layout.root}", exc) from exc
    if fd is None:
        raise StoreError(errno.EBUSY, f"run {layout.root} has a live writer; stop it first")
    actions: list[str] = []
    try:
        if not _index_readable(layout):
            actions.append(_move_aside(layout))
        try:
            actions += _recover_and_fix(layout)
            if _rows_still_wrong(layout):
                # Rows written anew still read back wrong: the table's own definition is
                # damaged (e.g. a column's type, so SQLite converts values). Rebuild.
                raise StoreError(0, "rewritten rows still do not read back as written")
        except (StoreError, sqlite3.Error) as exc:
            # SQLite could read the damaged file but not write it: rebuild from segments.
            log.warning("%s: fixing the index in place failed (%s)", layout.root, exc)
            actions.append(_move_aside(layout))
            actions += _recover_and_fix(layout)
        seal_index(layout)
    finally:
        fd.release()
    conn = connect(layout, write=False)
    try:
        final = verify_run(layout, conn, read_meta(layout).get("status"))
    except sqlite3.Error as exc:
        raise store_error(f"cannot check {layout.root}", exc) from exc
    finally:
        conn.close()
    final.repaired = actions
    return final


def _recover_and_fix(layout: Layout) -> list[str]:
    stats = recover(layout)
    actions = [f"{k.replace('_', ' ')}: {v}" for k, v in stats.items() if v]
    conn = connect(layout, write=True)
    try:
        fixes = _check(layout, conn, CheckReport(str(layout.root)), live=False)
        with conn:
            for action, seq, row in fixes:
                if action == FixAction.REBUILD:
                    raise StoreError(0, "the index cannot be read")
                if action == FixAction.DELETE:
                    conn.execute("DELETE FROM episodes WHERE seq = ?", (seq,))
                    actions.append(f"deleted damaged or dangling index row seq {seq}")
                elif row is not None and seq >= 0:  # in place: keeps its arrival order
                    conn.execute(insert_sql(at_seq=True), (seq, *row.stored()))
                    actions.append(f"rewrote the index row of episode {row.episode_id!r}")
                elif row is not None:
                    conn.execute(insert_sql(), row.stored())
                    actions.append(f"indexed episode {row.episode_id!r}")
    finally:
        conn.close()
    return actions


def _rows_still_wrong(layout: Layout) -> bool:
    conn = connect(layout, write=True)
    try:
        return bool(_check(layout, conn, CheckReport(str(layout.root)), live=False))
    finally:
        conn.close()


def _index_readable(layout: Layout) -> bool:
    if not layout.index.exists():
        return True
    try:
        conn = sqlite3.connect(layout.index)
        try:
            (integrity,) = conn.execute("PRAGMA integrity_check").fetchone()
            conn.execute("SELECT COUNT(*) FROM episodes").fetchone()
        finally:
            conn.close()
    except sqlite3.Error:
        return False
    return bool(integrity == "ok")


def _move_aside(layout: Layout) -> str:
    """Move a damaged index aside (recovery then rebuilds it from the segments)."""
    aside = layout.index.with_name("index.sqlite.damaged")
    for suffix in ("", "-wal", "-shm"):
        src = layout.index.with_name(layout.index.name + suffix)
        if src.exists():
            os.replace(src, aside.with_name(aside.name + suffix))
    log.warning("%s: index damaged; moved to %s and rebuilt", layout.root, aside)
    return f"moved the damaged index to {aside.name} and rebuilt it from the segments"
