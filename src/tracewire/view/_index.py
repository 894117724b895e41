"""The episode table of a run: an in-memory columnar copy of the store's index.

The store's index has SQL indexes for lookups (id, task, env, status) but not for every
ordering a person clicks on; ``ORDER BY reward LIMIT 50 OFFSET 50000`` over 100,000 rows
costs SQLite a second. So the viewer keeps the few columns it sorts and filters on as numpy
arrays (about 80 bytes a row), appends new rows by ``seq`` (``RunReader.index_since``: the index
is append-ordered), and answers a page with a vectorized filter, one cached sort per
ordering, and a fetch of the page's 50 rows by ``seq`` (``RunReader.index_at``). All reads go
through the store's ``RunReader``; the viewer has no SQL of its own.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..store import COLUMNS, RunReader
from ..trace import InfoKey
from ._cache import LRU
from ._http import Order

__all__ = ["NUMERIC", "OPTIONAL", "RANGED", "ROW_COLUMNS", "SORTABLE", "TEXT", "IndexQuery",
           "IndexTable", "Snapshot"]

#: Trainer and token-in/token-out columns (named for the ``info`` keys they copy), shown when
#: this build's index has them (a run written by a build without them reads them as null).
OPTIONAL = tuple(c for c in (InfoKey.STEP, InfoKey.POLICY_VERSION, InfoKey.TITO_MISMATCH)
                 if COLUMNS.get(c, "TEXT").split()[0] in ("INTEGER", "REAL"))
#: Numeric columns kept in memory (sortable, range-filterable).
NUMERIC = ("reward", "turns", "n_tokens", "errors", "duration", "started", "group_index",
           *OPTIONAL)
#: Columns with ``<name>_min`` / ``<name>_max`` filters besides ``reward``.
RANGED = OPTIONAL
#: Text columns kept in memory as category codes (sortable, equality-filterable).
TEXT = ("env", "status", "stop", "task_key", "group_id")
#: Orderings the table accepts; ``arrival`` is the index's append order (``seq``).
SORTABLE = ("arrival", *NUMERIC, *TEXT)
#: Columns of a returned row (logical name -> index column).
ROW_COLUMNS: dict[str, str] = {
    "arrival": "seq", "id": "episode_id", "env": "env", "task_key": "task_key",
    "group_index": "group_index", "status": "status", "ok": "ok", "stop": "stop",
    "reward": "reward", "turns": "turns", "n_tokens": "n_tokens", "errors": "errors",
    "duration": "duration", "started": "started", "group_id": "group_id",
    **{c: c for c in OPTIONAL},
}  # fmt: skip


@dataclass(frozen=True)
class IndexQuery:
    """Filters, ordering and page of an index request (already validated)."""

    sort: str = "arrival"
    order: Order = Order.ASC
    env: str | None = None
    status: str | None = None
    stop: str | None = None
    reward_min: float | None = None
    reward_max: float | None = None
    errors: bool | None = None
    q: str | None = None
    ranges: tuple[tuple[str, float | None, float | None], ...] = ()
    offset: int = 0
    limit: int = 50


@dataclass(frozen=True)
class Snapshot:
    """One version of the table: ``seq``, numeric columns (NaN = null), text columns as
    codes into ``values`` (append-only lists)."""

    version: int
    seq: NDArray[np.int64]
    num: dict[str, NDArray[np.float64]]
    codes: dict[str, NDArray[np.int32]]
    values: dict[str, list[str | None]]


class _Cats:
    """Strings of one column as int32 codes into a growing list of distinct values."""

    def __init__(self) -> None:
        self.values: list[str | None] = []
        self.code: dict[str | None, int] = {}
        self._rank: NDArray[np.int64] | None = None

    def encode(self, items: list[str | None]) -> NDArray[np.int32]:
        out = np.empty(len(items), dtype=np.int32)
        code, values = self.code, self.values
        for i, v in enumerate(items):
            c = code.get(v)
            if c is None:
                c = code[v] = len(values)
                values.append(v)
                self._rank = None
            out[i] = c
        return out

    def rank(self) -> NDArray[np.int64]:
        # Sort position of each code (None first), recomputed only when values were added.
        if self._rank is None or len(self._rank) != len(self.values):
            order = sorted(range(len(self.values)), key=lambda c: (self.values[c] is not None,
                                                                   self.values[c] or ""))
            rank = np.empty(len(order), dtype=np.int64)
            rank[order] = np.arange(len(order))
            self._rank = rank
        return self._rank


class IndexTable:
    """The viewer's table of a run's index, read through ``run()`` (the store's read-side
    ``RunReader``, opened on first use); thread-safe, read-only."""

    def __init__(self, run: Callable[[], RunReader]) -> None:
        self._run = run
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self.version = 0
        self._n = 0
        self._last_seq = 0
        self._seq: NDArray[np.int64] = np.empty(0, dtype=np.int64)
        self._num: dict[str, NDArray[np.float64]] = {k: np.empty(0) for k in NUMERIC}
        self._cats: dict[str, _Cats] = {k: _Cats() for k in TEXT}
        self._codes: dict[str, NDArray[np.int32]] = {
            k: np.empty(0, dtype=np.int32) for k in TEXT
        }
        self._orders: LRU[tuple[Any, ...], NDArray[np.int64]] = LRU(16)
        self._sorted: dict[str, NDArray[np.int64]] = {}

    def reload(self) -> None:
        """Forget the in-memory copy and load it again from the index (benches time this)."""
        with self._lock:
            self._reset()
        self.refresh()

    def drop_orderings(self) -> None:
        """Forget the cached sorts, so the next page pays for its ordering again (benches)."""
        with self._lock:
            self._orders.clear()
            self._sorted.clear()

    def _store(self) -> RunReader:
        return self._run()

    # -- the in-memory copy --------------------------------------------------------------
    def refresh(self) -> None:
        """Catch up with rows appended since the last call (a full reload if rows vanished,
        which only a re-appended episode id causes)."""
        with self._lock:
            store = self._store()
            max_seq = store.index_head()
            if max_seq == self._last_seq:
                return
            count = len(store)
            if count < self._n or max_seq < self._last_seq:
                self._reset()
            cols = ("seq", *NUMERIC, *TEXT)
            rows = store.index_since(self._last_seq, cols)
            if rows:
                self._append(rows)
            if self._n != count:
                # Some older row was replaced: rebuild from scratch (rare).
                self._reset()
                self._append(store.index_since(0, cols))
            self.version += 1
            self._orders.clear()
            self._sorted.clear()

    def _append(self, rows: list[tuple[Any, ...]]) -> None:
        if not rows:
            return
        columns = list(zip(*rows, strict=True))
        self._seq = np.concatenate([self._seq, np.asarray(columns[0], dtype=np.int64)])
        for i, k in enumerate(NUMERIC, start=1):
            arr = np.array(columns[i], dtype=np.float64)  # None becomes NaN
            self._num[k] = np.concatenate([self._num[k], arr])
        for i, k in enumerate(TEXT, start=1 + len(NUMERIC)):
            codes = self._cats[k].encode(list(columns[i]))
            self._codes[k] = np.concatenate([self._codes[k], codes])
        self._n = int(self._seq.shape[0])
        self._last_seq = int(self._seq[-1])

    def _key(self, sort: str) -> NDArray[Any]:
        if sort == "arrival":
            return self._seq
        if sort in TEXT:
            return self._cats[sort].rank()[self._codes[sort]]
        return self._num[sort]

    def _mask(self, q: IndexQuery) -> NDArray[np.bool_] | None:
        conds: list[NDArray[np.bool_]] = []
        for key, value in (("env", q.env), ("status", q.status), ("stop", q.stop)):
            if value is not None:
                code = self._cats[key].code.get(value, -1)
                conds.append(self._codes[key] == code)
        reward = self._num["reward"]
        if q.reward_min is not None:
            conds.append(reward >= q.reward_min)
        if q.reward_max is not None:
            conds.append(reward <= q.reward_max)
        for col, lo, hi in q.ranges:
            values = self._num[col]
            if lo is not None:
                conds.append(values >= lo)
            if hi is not None:
                conds.append(values <= hi)
        if q.errors is not None:
            conds.append(self._num["errors"] > 0 if q.errors else self._num["errors"] == 0)
        if q.q is not None:
            needle = q.q.lower()
            cats = self._cats["task_key"].values
            hits = [c for c, v in enumerate(cats) if v is not None and needle in v.lower()]
            conds.append(np.isin(self._codes["task_key"], np.asarray(hits, dtype=np.int32)))
        if not conds:
            return None
        mask = conds[0]
        for c in conds[1:]:
            mask = mask & c
        return mask

    def _order(self, q: IndexQuery) -> NDArray[np.int64]:
        # Row positions in display order; cached per (filters, ordering) until rows arrive.
        key = (q.sort, q.order, q.env, q.status, q.stop, q.reward_min, q.reward_max,
               q.errors, q.q, q.ranges)  # fmt: skip
        order = self._orders.get(key)
        if order is not None:
            return order
        mask = self._mask(q)
        if q.sort == "arrival":
            rows = np.arange(self._n) if mask is None else np.flatnonzero(mask)
        else:
            # One stable sort per column and data version, shared by every filter: a filter
            # then only selects from it (O(rows)), it never sorts again.
            full = self._sorted.get(q.sort)
            if full is None:
                # Positions are in arrival order, so stability keeps arrival order among
                # ties; numpy sorts NaN (missing values) last.
                full = self._sorted[q.sort] = np.argsort(self._key(q.sort), kind="stable")
            rows = full if mask is None else full[mask[full]]
        if q.order == Order.DESC:
            rows = rows[::-1]
        self._orders.put(key, rows)
        return rows

    # -- answers -------------------------------------------------------------------------
    def page(self, q: IndexQuery) -> dict[str, Any]:
        """One page of rows (all index fields the table shows) plus the filtered total."""
        self.refresh()
        with self._lock:
            order = self._order(q)
            picked = [int(s) for s in self._seq[order[q.offset : q.offset + q.limit]]]
            total = int(order.shape[0])
        rows: list[dict[str, Any]] = []
        if picked:
            names = list(ROW_COLUMNS)
            got = self._store().index_at(picked, list(ROW_COLUMNS.values()))
            by_seq = {r[0]: dict(zip(names, r, strict=True)) for r in got}
            rows = [by_seq[s] for s in picked if s in by_seq]
        return {"rows": rows, "total": total, "offset": q.offset, "limit": q.limit,
                "sort": q.sort, "order": q.order}  # fmt: skip

    def snapshot(self) -> Snapshot:
        """The table's current arrays (caught up first): they are replaced, never changed in
        place, when rows arrive, so a caller may read them without the lock."""
        self.refresh()
        with self._lock:
            return Snapshot(self.version, self._seq, dict(self._num), dict(self._codes),
                            {k: c.values for k, c in self._cats.items()})

    def count(self) -> int:
        """Number of indexed episodes (a cheap query; does not load the table)."""
        return len(self._store())

    def facets(self) -> dict[str, list[Any]]:
        """Distinct values of env, status and stop (for the filter menus), at most 200 each."""
        self.refresh()
        with self._lock:
            return {
                k: sorted(v for v in self._cats[k].values if v is not None)[:200]
                for k in ("env", "status", "stop")
            }

    def present(self) -> list[str]:
        """The optional columns (:data:`OPTIONAL`) holding a value in at least one row."""
        self.refresh()
        with self._lock:
            return [c for c in OPTIONAL if bool(np.any(~np.isnan(self._num[c])))]

    def by_step(self) -> dict[str, Any]:
        """Mean reward (and mean ``tito_mismatch`` where recorded) per ``step`` value, over
        the rows that have one; empty lists when no row has a step."""
        self.refresh()
        with self._lock:
            step = self._num["step"] if "step" in self._num else np.empty(0)
            reward = self._num["reward"]
            mism = self._num.get(InfoKey.TITO_MISMATCH)
        has = ~np.isnan(step)
        if not bool(has.any()):
            return {"step": [], "reward": [], "n": []}
        steps, inverse = np.unique(step[has], return_inverse=True)

        def mean_of(values: NDArray[np.float64]) -> list[float | None]:
            v = values[has]
            ok = ~np.isnan(v)
            sums = np.bincount(inverse[ok], weights=v[ok], minlength=len(steps))
            counts = np.bincount(inverse[ok], minlength=len(steps))
            return [float(t / c) if c else None for t, c in zip(sums, counts, strict=True)]

        out: dict[str, Any] = {
            "step": [int(x) for x in steps],
            "reward": mean_of(reward),
            "n": np.bincount(inverse, minlength=len(steps)).tolist(),
        }
        if mism is not None and bool(np.any(~np.isnan(mism[has]))):
            out[InfoKey.TITO_MISMATCH] = mean_of(mism)
        return out

    def stats(self, bins: int) -> dict[str, Any]:
        """Reward histogram (``bins`` equal-width bins) and mean reward over arrival
        (``bins`` consecutive groups of episodes in arrival order)."""
        self.refresh()
        with self._lock:
            reward = self._num["reward"]
            seq = self._seq
        ok = ~np.isnan(reward)
        r = reward[ok]
        if r.size == 0:
            return {"n": 0, "mean": None, "hist": {"edges": [], "counts": []},
                    "over_time": {"x": [], "mean": [], "n": []}}  # fmt: skip
        lo, hi = float(r.min()), float(r.max())
        if hi <= lo:
            lo, hi = lo - 0.5, hi + 0.5
        counts, edges = np.histogram(r, bins=bins, range=(lo, hi))
        groups = np.array_split(np.arange(r.size), min(bins, r.size))
        s = seq[ok]
        return {
            "n": int(r.size),
            "mean": float(r.mean()),
            "hist": {"edges": edges.tolist(), "counts": counts.tolist()},
            "over_time": {
                "x": [float(s[g].mean()) for g in groups],
                "mean": [float(r[g].mean()) for g in groups],
                "n": [int(g.size) for g in groups],
            },
        }
