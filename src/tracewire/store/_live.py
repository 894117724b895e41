"""In-flight episodes of a run, assembled incrementally from their journals."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from ..trace import Episode
from ._journal import JournalTail
from ._layout import Layout

__all__ = ["LiveTails"]


class LiveTails:
    """One :class:`JournalTail` per journal in ``live/``, polled by ``RunReader.live``;
    ``indexed(ids)`` says which episodes already have an index row (their journal is
    about to go, so they are no longer in flight)."""

    def __init__(self, layout: Layout, indexed: Callable[[list[str]], set[str]]) -> None:
        self._layout = layout
        self._indexed = indexed
        self.tails: dict[Path, JournalTail] = {}
        self._lock = threading.Lock()

    def poll(self) -> list[Episode]:
        """Read what each journal gained since the last poll; the episodes not yet indexed."""
        with self._lock:
            tails = self.tails
            paths = self._layout.journals()
            present = set(paths)
            for gone in [p for p in tails if p not in present]:
                del tails[gone]
            polled: list[JournalTail] = []
            for path in paths:
                tail = tails.get(path)
                if tail is None:
                    tail = tails[path] = JournalTail(path)
                if not tail.poll():
                    del tails[path]
                elif tail.episode is not None:
                    polled.append(tail)
            ids = [t.episode.id for t in polled if t.episode is not None]
            done = self._indexed(ids)
            out = []
            for tail in polled:
                ep = tail.episode
                assert ep is not None
                if ep.id in done:  # appended; its journal is about to be deleted
                    del tails[tail.path]
                else:
                    out.append(ep)
            return out
