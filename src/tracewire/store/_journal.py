"""Journals: in-flight episodes written delta by delta, so a crash loses at most one turn.

A :class:`Journal` watches every trace of an episode. On each ``notify()`` it asks an
``EpisodeSender`` for what changed (O(new data)) and hands the delta to the writer thread,
which appends it as one record to ``live/<episode>.twj``. Deltas that only change
``trace.pending`` (the messages of a request in flight) are journaled too, so a viewer in
another process sees them; pending never reaches a stored record (``TraceHeader`` has no
such field) nor the index. Reading a journal back assembles the deltas up to the first torn
or corrupt record; :class:`JournalTail` does so incrementally, reading only new bytes.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from .._errors import DecodeError
from ..codec import (
    RECORD_PREFIX,
    EpisodeAssembler,
    EpisodeDelta,
    EpisodeSender,
    decode_record,
    record_length,
)
from ..trace import Episode, Trace

if TYPE_CHECKING:
    from ._writer import JournalItem

__all__ = ["Journal", "JournalTail", "read_journal"]

log = logging.getLogger("tracewire.store")


class Journal:
    """Journals one in-flight episode until it is appended (or the run closes)."""

    def __init__(self, episode: Episode, path: Path, submit: Callable[[JournalItem], None]):
        from ._writer import JournalItem

        self.episode = episode
        self.path = path
        #: The first write error, if any (journaling stops after it; appends are unaffected).
        self.error: BaseException | None = None
        self._item = JournalItem
        self._submit = submit
        self._sender = EpisodeSender(episode)
        self._seq = 0
        self._unwatch: dict[str, Callable[[], None]] = {}
        self._closed = False
        self._watch_all()
        self.update()

    def _watch_all(self) -> None:
        for t in self.episode.traces:
            if t.id not in self._unwatch:
                self._unwatch[t.id] = t.watch(self._on_notify)

    def _on_notify(self, _trace: Trace) -> None:
        self.update()

    def _fail(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc
            log.warning("journal of episode %s stopped: %s", self.episode.id, exc)

    def update(self) -> None:
        """Journal whatever changed since the last update (called on every ``notify()``;
        call it yourself after changing episode-level fields or adding a trace)."""
        if self._closed or self.error is not None:
            return
        self._watch_all()  # traces added since
        d = self._sender.delta()
        if d is None:
            return
        self._sender.commit(d)  # the delta is a snapshot; the writer thread owns it now
        d.seq = self._seq
        self._seq += 1
        self._submit(self._item(self.path, d, self._fail))

    def close(self) -> None:
        """Stop watching the episode (the file stays until the episode is appended)."""
        if self._closed:
            return
        self._closed = True
        for unwatch in self._unwatch.values():
            unwatch()
        self._unwatch.clear()

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._closed


class JournalTail:
    """Incremental reader of one journal file: remembers the byte offset of the first record
    not yet applied and the episode assembled so far, so each :meth:`poll` reads only what
    was appended since (a torn last record is retried on the next poll)."""

    __slots__ = ("asm", "ino", "offset", "path", "stuck")

    def __init__(self, path: Path) -> None:
        self.path = path
        self.asm = EpisodeAssembler()
        self.offset = 0
        self.ino = -1
        #: Set at a complete but corrupt record: nothing after it is applied (as on recovery).
        self.stuck = False

    @property
    def episode(self) -> Episode | None:
        """The episode assembled so far (None before the first record)."""
        return self.asm.episode

    def poll(self) -> bool:
        """Apply the records appended since the last poll; False if the file is gone."""
        try:
            with open(self.path, "rb") as f:
                st = os.fstat(f.fileno())
                if st.st_ino != self.ino or st.st_size < self.offset:
                    # A new file under the same name (or cut back): start over.
                    self.asm, self.offset, self.stuck = EpisodeAssembler(), 0, False
                    self.ino = st.st_ino
                if self.stuck or st.st_size - self.offset < RECORD_PREFIX:
                    return True
                f.seek(self.offset)
                data = f.read(st.st_size - self.offset)
        except FileNotFoundError:
            return False
        used, self.stuck = _apply_records(self.asm, data)
        self.offset += used
        return True


def _apply_records(asm: EpisodeAssembler, data: bytes) -> tuple[int, bool]:
    """Apply whole records from ``data``: ``(bytes used, hit a corrupt record)``."""
    pos = 0
    view = memoryview(data)
    while len(data) - pos >= RECORD_PREFIX:
        try:
            n = record_length(view[pos : pos + RECORD_PREFIX])
            if pos + n > len(data):
                break  # torn, or still being written
            d = decode_record(view[pos : pos + n])
            if not isinstance(d, EpisodeDelta):
                return pos, True
            asm.apply(d)
        except DecodeError:
            return pos, True
        pos += n
    return pos, False


def read_journal(path: Path) -> Episode | None:
    """Assemble a journal file up to its first torn or corrupt record (None if empty)."""
    tail = JournalTail(path)
    tail.poll()
    return tail.episode

