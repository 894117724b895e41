"""Where the viewer's data comes from: the store's read API (records, journals, index).

All methods block (file and SQLite I/O, record decoding) and are called from worker
threads. Completed episodes are immutable, so their decoded form and their branch columns
are cached (bounded LRUs); live episodes are assembled from the journal on each poll.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..store import RunReader, open_run
from ..trace import Episode
from ._cache import LRU
from ._groups import GroupTable
from ._health import RunHealth
from ._heat import token_kinds
from ._index import IndexQuery, IndexTable
from ._vocab import VocabTable, resolve_tokenizer

__all__ = ["RunSource"]

Columns = dict[str, NDArray[Any]]


class RunSource:
    """Read access to one run directory for the viewer (thread-safe)."""

    def __init__(self, run_dir: Path, *, cache_episodes: int = 4, cache_branches: int = 8) -> None:
        self.run_dir = run_dir
        self._run: RunReader | None = None
        self.index = IndexTable(self.run)
        self.groups = GroupTable(self.index, self.run)
        self._lock = threading.Lock()
        self._episodes: LRU[str, Episode] = LRU(cache_episodes)
        self._branches: LRU[tuple[str, int, int, str | None], Columns] = LRU(cache_branches)
        self._live: dict[str, Episode] = {}
        self._vocab: VocabTable | None = None
        self._health: RunHealth | None = None

    def run(self) -> RunReader:
        """The store's ``RunReader`` (opened once, on first use)."""
        with self._lock:
            if self._run is None:
                self._run = open_run(self.run_dir)
            return self._run

    def warm(self) -> None:
        """Open the run and load the episode table now (start-up, in a worker thread)."""
        self.run()
        self.index.refresh()

    def vocab(self) -> VocabTable:
        """The run's tokenizer as a vocabulary table (resolved once; built on first use)."""
        meta = self.meta()  # outside the lock: run() takes it
        with self._lock:
            if self._vocab is None:
                self._vocab = VocabTable(resolve_tokenizer(meta, self.run_dir))
            return self._vocab

    def steps_signature(self) -> tuple[int, int]:
        """Size and modification time of the run's per-step summary file ((0, 0) if none):
        changes whenever ``tracewire train`` appends a step."""
        try:
            st = (self.run_dir / "train_steps.jsonl").stat()
        except OSError:
            return (0, 0)
        return (st.st_size, st.st_mtime_ns)

    def health(self) -> dict[str, Any]:
        """Whether the run is being written, closed, or left by a crashed writer
        (``state: needs_repair``; see :mod:`._health`). Rate-limited, cheap."""
        run = self.run()
        with self._lock:
            if self._health is None:
                self._health = RunHealth(run.layout)
            health = self._health
        return health.check(run.meta.get("status"))

    def meta(self) -> dict[str, Any]:
        """The run's metadata."""
        return dict(self.run().meta or {})

    def index_count(self) -> int:
        """Number of indexed (finished) episodes."""
        return self.index.count()

    def page(self, q: IndexQuery) -> dict[str, Any]:
        """One page of the episode table."""
        return self.index.page(q)

    def live(self) -> list[Episode]:
        """In-flight episodes, freshly assembled from the journal; remembered for lookups."""
        episodes = list(self.run().live())
        self._live = {ep.id: ep for ep in episodes}
        return episodes

    def episode(self, episode_id: str) -> tuple[Episode, bool] | None:
        """``(episode, live)`` or None when the run has no such episode."""
        ep = self._episodes.get(episode_id)
        if ep is not None:
            return ep, False
        try:
            ep = self.run().get(episode_id)
        except KeyError:
            ep = None
        if ep is not None:
            self._episodes.put(episode_id, ep)
            return ep, False
        self.live()
        live = self._live.get(episode_id)
        return None if live is None else (live, True)

    def branch_columns(self, ep: Episode, live: bool, t: int, leaf: int,
                       extra: str | None = None) -> Columns:
        """ids/mask/logprobs/kind (see :mod:`._heat`) of the path root→``leaf`` of trace
        ``t``, and extra column ``extra`` if asked (as ``extra``); cached when final."""
        key = (ep.id, t, leaf, extra)
        if not live:
            cols = self._branches.get(key)
            if cols is not None:
                return cols
        tr = ep.traces[t]
        b = tr.branch(leaf)
        cols = {"ids": b.ids, "mask": b.mask, "logprobs": b.logprobs,
                "kind": token_kinds(tr, b.nodes, self.vocab().boundary())}
        if extra is not None:
            cols["extra"] = np.asarray(b.column(extra), dtype=np.float32)
        if not live:
            # A non-contiguous branch is a concatenation: keep it rather than redo it for
            # every window the token view fetches.
            self._branches.put(key, {k: np.asarray(v) for k, v in cols.items()})
        return cols
