"""Groups of rollouts (one task, r samples): reward spread and group-normalized advantages.

A group is the episodes sharing a ``group_id`` (``tracewire eval`` and ``tracewire train``
set one per task and step); episodes without one are grouped by ``task_key`` (key
``task:<task_key>``). Everything is computed from the viewer's in-memory index table with
numpy, once per data version, so listing 10,000 episodes' groups costs a few sorts, and a
group page costs one fetch of its r rows by ``seq``. The advantage is the trainer's:
``(r - mean) / (std + 1e-6)`` within the group (population std), 0 when all rewards are
equal.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
from numpy.typing import NDArray

from ..store import RunReader
from ._http import Order
from ._index import IndexTable, Snapshot

__all__ = ["EQUAL_EPS", "GROUP_ROW", "GROUP_SORTS", "GroupQuery", "GroupTable", "advantages"]

#: Rewards closer than this count as equal (a group with spread below it teaches nothing).
EQUAL_EPS = 1e-9
#: Orderings of the group list.
GROUP_SORTS = ("arrival", "mean", "spread", "std", "n", "task_key")
#: Index columns of one rollout on a group page.
GROUP_ROW = ("seq", "episode_id", "group_id", "group_index", "env", "task_key", "status",
             "stop", "reward", "rewards", "turns", "n_tokens", "output_tokens", "errors",
             "duration", "step", "policy_version")
#: Member rewards listed per group row (a bigger group lists its extremes only).
LIST_REWARDS = 64


def advantages(rewards: NDArray[np.float64], mean: float, std: float) -> NDArray[np.float64]:
    """Group-normalized advantages of ``rewards`` given the group's mean and std."""
    if not np.isfinite(std) or std <= 1e-12:
        return np.where(np.isnan(rewards), np.nan, 0.0)
    return (rewards - mean) / (std + 1e-6)


@dataclass(frozen=True)
class GroupQuery:
    """Filters, ordering and page of a group list request (already validated)."""

    spread: str = "any"  # any | equal | mixed
    env: str | None = None
    q: str | None = None
    step_min: float | None = None
    step_max: float | None = None
    sort: str = "arrival"
    order: Order = Order.ASC
    offset: int = 0
    limit: int = 50


@dataclass(frozen=True)
class _Built:
    version: int
    keys: list[str]
    pos: dict[str, int]
    group_id: list[str | None]
    task: list[str | None]
    env: list[str | None]
    n: NDArray[np.int64]
    mean: NDArray[np.float64]
    std: NDArray[np.float64]
    lo: NDArray[np.float64]
    hi: NDArray[np.float64]
    step_lo: NDArray[np.float64]
    step_hi: NDArray[np.float64]
    first: NDArray[np.int64]
    members: NDArray[np.int64]  # row positions grouped by group, arrival order within
    offsets: NDArray[np.int64]
    seq: NDArray[np.int64]
    reward: NDArray[np.float64]

    @property
    def spread(self) -> NDArray[np.float64]:
        return self.hi - self.lo


def _build(s: Snapshot) -> _Built:
    gid, gvals = s.codes["group_id"], s.values["group_id"]
    tcodes, tvals = s.codes["task_key"], s.values["task_key"]
    null = next((c for c, v in enumerate(gvals) if v is None), -1)
    n_g = len(gvals)
    key = np.where(gid == null, n_g + tcodes.astype(np.int64), gid.astype(np.int64))
    uniq, inv = np.unique(key, return_inverse=True)
    inv = inv.astype(np.int64)
    members = np.argsort(inv, kind="stable").astype(np.int64)
    counts = np.bincount(inv, minlength=len(uniq)).astype(np.int64)
    offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    r = s.num["reward"]
    ok = ~np.isnan(r)
    cnt = np.bincount(inv, weights=ok, minlength=len(uniq))
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.bincount(inv, weights=np.where(ok, r, 0.0), minlength=len(uniq)) / cnt
        dev = np.where(ok, (r - mean[inv]) ** 2, 0.0)
        std = np.sqrt(np.bincount(inv, weights=dev, minlength=len(uniq)) / cnt)
    starts = offsets[:-1]
    rs = r[members]
    lo = np.minimum.reduceat(np.where(np.isnan(rs), np.inf, rs), starts) if len(uniq) else rs
    hi = np.maximum.reduceat(np.where(np.isnan(rs), -np.inf, rs), starts) if len(uniq) else rs
    lo = np.where(np.isinf(lo), np.nan, lo)
    hi = np.where(np.isinf(hi), np.nan, hi)
    step = s.num.get("step")
    if step is not None and len(uniq):
        st = step[members]
        step_lo = np.fmin.reduceat(st, starts)
        step_hi = np.fmax.reduceat(st, starts)
    else:
        step_lo = step_hi = np.full(len(uniq), np.nan)
    first_rows = members[starts]
    keys: list[str] = []
    group_id: list[str | None] = []
    for u in uniq.tolist():
        if u < n_g:
            keys.append(str(gvals[u]))
            group_id.append(gvals[u])
        else:
            keys.append("task:" + str(tvals[u - n_g]))
            group_id.append(None)
    evals = s.values["env"]
    return _Built(
        version=s.version, keys=keys, pos={k: i for i, k in enumerate(keys)},
        group_id=group_id,
        task=[tvals[c] for c in tcodes[first_rows].tolist()],
        env=[evals[c] for c in s.codes["env"][first_rows].tolist()],
        n=counts, mean=mean, std=std, lo=lo, hi=hi, step_lo=step_lo, step_hi=step_hi,
        first=s.seq[first_rows], members=members, offsets=offsets, seq=s.seq, reward=r,
    )


def _num(x: float) -> float | None:
    return None if np.isnan(x) else float(x)


class GroupTable:
    """Groups of one run's index table (rebuilt when the table's version moves)."""

    def __init__(self, index: IndexTable, run: Callable[[], RunReader]) -> None:
        self.index = index
        self._run = run
        self._lock = threading.Lock()
        self._built: _Built | None = None

    def drop(self) -> None:
        """Forget the computed groups, so the next request rebuilds them (benches)."""
        with self._lock:
            self._built = None

    def _current(self) -> _Built:
        snap = self.index.snapshot()
        with self._lock:
            if self._built is None or self._built.version != snap.version:
                self._built = _build(snap)
            return self._built

    def _select(self, b: _Built, q: GroupQuery) -> NDArray[np.int64]:
        keep = np.ones(len(b.keys), dtype=bool)
        spread = b.spread
        if q.spread == "equal":
            keep &= ~(spread > EQUAL_EPS)
        elif q.spread == "mixed":
            keep &= spread > EQUAL_EPS
        if q.env is not None:
            keep &= np.array([e == q.env for e in b.env], dtype=bool)
        if q.q is not None:
            needle = q.q.lower()
            keep &= np.array([t is not None and needle in t.lower() for t in b.task], dtype=bool)
        if q.step_min is not None:
            keep &= b.step_lo >= q.step_min
        if q.step_max is not None:
            keep &= b.step_hi <= q.step_max
        rows = np.flatnonzero(keep)
        if q.sort == "arrival":
            key: NDArray[Any] = b.first[rows]
        elif q.sort == "task_key":
            key = np.array([b.task[i] or "" for i in rows.tolist()], dtype=object)
        else:
            col = {"mean": b.mean, "spread": spread, "std": b.std, "n": b.n}[q.sort]
            key = col[rows]
        order = rows[np.argsort(key, kind="stable")]
        return order[::-1] if q.order == Order.DESC else order

    def _row(self, b: _Built, g: int) -> dict[str, Any]:
        mem = b.members[b.offsets[g] : b.offsets[g + 1]]
        rewards = np.sort(b.reward[mem])[::-1]
        if len(rewards) > LIST_REWARDS:
            half = LIST_REWARDS // 2
            rewards = np.concatenate((rewards[:half], rewards[-half:]))
        return {
            "group": b.keys[g], "group_id": b.group_id[g], "task_key": b.task[g],
            "env": b.env[g], "n": int(b.n[g]), "mean": _num(b.mean[g]), "std": _num(b.std[g]),
            "min": _num(b.lo[g]), "max": _num(b.hi[g]), "spread": _num(b.hi[g] - b.lo[g]),
            "step_min": _num(b.step_lo[g]), "step_max": _num(b.step_hi[g]),
            "first": int(b.first[g]), "rewards": [_num(x) for x in rewards.tolist()],
        }

    def page(self, q: GroupQuery) -> dict[str, Any]:
        """One page of groups plus the filtered total and the equal/mixed counts of all."""
        b = self._current()
        order = self._select(b, q)
        mixed = int(np.count_nonzero(b.spread > EQUAL_EPS))
        rows = [self._row(b, int(g)) for g in order[q.offset : q.offset + q.limit]]
        return {"rows": rows, "total": int(order.shape[0]), "offset": q.offset,
                "limit": q.limit, "sort": q.sort, "order": q.order, "groups": len(b.keys),
                "mixed": mixed, "equal": len(b.keys) - mixed}  # fmt: skip

    def group(self, key: str, q: GroupQuery) -> dict[str, Any] | None:
        """The rollouts of group ``key`` sorted by reward (best first) with their advantages,
        and the neighbouring groups in the order ``q`` lists them; None if no such group."""
        b = self._current()
        g = b.pos.get(key)
        if g is None:
            return None
        mem = b.members[b.offsets[g] : b.offsets[g + 1]]
        got = self._run().index_at([int(x) for x in b.seq[mem]], GROUP_ROW)
        rows = [dict(zip(GROUP_ROW, r, strict=True)) for r in got]
        reward = np.array([np.nan if r["reward"] is None else r["reward"] for r in rows],
                          dtype=np.float64)
        adv = advantages(reward, float(b.mean[g]), float(b.std[g]))
        names: list[str] = []
        for r, a in zip(rows, adv.tolist(), strict=True):
            parts = orjson.loads(r.pop("rewards") or "{}")
            r["rewards"] = parts if isinstance(parts, dict) else {}
            names += [k for k in r["rewards"] if k not in names]
            r["advantage"] = None if np.isnan(a) else a
            r["id"] = r.pop("episode_id")
        rows.sort(key=lambda r: (-(r["reward"] if r["reward"] is not None else -np.inf),
                                 r["group_index"] if r["group_index"] is not None else 0))
        order = self._select(b, q)
        where = np.flatnonzero(order == g)
        prev_key = next_key = None
        if where.size:
            k = int(where[0])
            prev_key = b.keys[int(order[k - 1])] if k > 0 else None
            next_key = b.keys[int(order[k + 1])] if k + 1 < len(order) else None
        return {**self._row(b, g), "reward_names": names, "rollouts": rows,
                "prev": prev_key, "next": next_key}
