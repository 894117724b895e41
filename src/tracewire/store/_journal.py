"""Journals: in-flight episodes written delta by delta, so a crash loses at most one turn.

A :class:`Journal` watches every trace of an episode. On each ``notify()`` it asks an
``EpisodeSender`` for what changed (O(new data)), drops the preview-only ``pending`` field,
and hands the delta to the writer thread, which appends it as one record to
``live/<episode>.twj``. Reading a journal back assembles the deltas up to the first torn or
corrupt record.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from msgspec import UNSET

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

__all__ = ["Journal", "read_journal"]

log = logging.getLogger("tracewire.store")


def _empty(d: EpisodeDelta) -> bool:
    if d.head is not None or d.dropped or d.final:
        return False
    for td in d.traces:
        if (
            td.reset or td.nodes or td.calls or td.errors or td.columns
            or td.agent is not UNSET or td.timing is not UNSET or td.rewards is not UNSET
            or td.metrics is not UNSET or td.info is not UNSET or td.stop is not UNSET
            or td.completed is not UNSET or td.ok is not UNSET
        ):  # fmt: skip
            return False
    return True


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
        for td in d.traces:
            td.pending = UNSET  # preview only, never persisted
        if _empty(d):
            return
        d.seq = self._seq  # our own numbering: pending-only deltas are not written
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


def read_journal(path: Path) -> Episode | None:
    """Assemble a journal file up to its first torn or corrupt record (None if empty)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    asm = EpisodeAssembler()
    pos = 0
    while len(data) - pos >= RECORD_PREFIX:
        try:
            n = record_length(data[pos : pos + RECORD_PREFIX])
            if pos + n > len(data):
                break
            d = decode_record(memoryview(data)[pos : pos + n])
            if not isinstance(d, EpisodeDelta):
                break
            asm.apply(d)
        except DecodeError:
            break
        pos += n
    return asm.episode


def journal_size(path: Path) -> int:
    """Bytes in a journal file (0 if gone)."""
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0
