"""Run against run: mean reward per task in two selections of episodes, and the difference.

A selection is one run's index table, optionally cut to a range of ``step`` values, so the
two sides can be two eval runs, two train runs, or two step ranges of one train run. Tasks
are matched by ``task_key``; ``diff`` is B's mean minus A's, so the tasks that got worse
come first in the default order. Pure numpy over the in-memory tables (worker thread).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ._http import Order
from ._index import Snapshot

__all__ = ["COMPARE_SORTS", "SAME_EPS", "Selection", "compare"]

#: Orderings of the per-task rows.
COMPARE_SORTS = ("diff", "a", "b", "task_key", "n")
#: Differences at most this large count as unchanged.
SAME_EPS = 1e-9


@dataclass(frozen=True)
class Selection:
    """Which episodes of a run a side takes: all, or those with ``step`` in a range."""

    step_min: float | None = None
    step_max: float | None = None

    def describe(self) -> dict[str, Any]:
        """JSON form."""
        return {"step_min": self.step_min, "step_max": self.step_max}


def _per_task(s: Snapshot, sel: Selection, best: bool
              ) -> tuple[dict[str, tuple[float, int, int]], int]:
    # Per task: mean reward, episodes, and the seq of its best (or worst) episode, the one a
    # diff of the two sides starts from (earliest on ties).
    r = s.num["reward"]
    keep = ~np.isnan(r)
    step = s.num.get("step")
    if step is not None:
        if sel.step_min is not None:
            keep &= step >= sel.step_min
        if sel.step_max is not None:
            keep &= step <= sel.step_max
    elif sel.step_min is not None or sel.step_max is not None:
        keep &= False
    values = s.values["task_key"]
    codes = s.codes["task_key"][keep].astype(np.int64)
    rk, seq = r[keep], s.seq[keep]
    sums = np.bincount(codes, weights=rk, minlength=len(values))
    counts = np.bincount(codes, minlength=len(values))
    order = np.lexsort((seq, -rk if best else rk, codes))
    first = np.flatnonzero(np.r_[True, codes[order][1:] != codes[order][:-1]]) if len(
        order) else np.empty(0, dtype=np.int64)
    pick = dict(zip(codes[order][first].tolist(), seq[order][first].tolist(), strict=True))
    out = {str(values[c]): (float(sums[c] / counts[c]), int(counts[c]), int(pick[c]))
           for c in np.flatnonzero(counts).tolist()}
    return out, int(keep.sum())


def _mean(d: dict[str, tuple[float, int, int]]) -> float | None:
    n = sum(c for _, c, _ in d.values())
    return sum(m * c for m, c, _ in d.values()) / n if n else None


def compare(a: Snapshot, sel_a: Selection, b: Snapshot, sel_b: Selection, *, sort: str = "diff",
            order: Order = Order.ASC, offset: int = 0, limit: int = 100) -> dict[str, Any]:
    """Per-task rows ``{task_key, a, a_n, b, b_n, diff, a_seq, b_seq}`` (one page, sorted;
    tasks on one side only have ``diff: null`` and sort last; ``a_seq`` is A's best episode
    of the task, ``b_seq`` B's worst) and a summary of both sides."""
    ta, na = _per_task(a, sel_a, best=True)
    tb, nb = _per_task(b, sel_b, best=False)
    rows: list[dict[str, Any]] = []
    for task in sorted(set(ta) | set(tb)):
        ma, ca, sa = ta.get(task, (None, 0, None))
        mb, cb, sb = tb.get(task, (None, 0, None))
        diff = None if ma is None or mb is None else mb - ma
        rows.append({"task_key": task, "a": ma, "a_n": ca, "b": mb, "b_n": cb, "diff": diff,
                     "a_seq": sa, "b_seq": sb})

    def key(r: dict[str, Any]) -> Any:
        v = r["task_key"] if sort == "task_key" else (
            r["a_n"] + r["b_n"] if sort == "n" else r[sort])
        return (v is None, v if v is not None else 0, r["task_key"])

    rows.sort(key=key, reverse=False)
    if order == Order.DESC:
        # Missing values stay last either way.
        have = [r for r in rows if key(r)[0] is False][::-1]
        rows = have + [r for r in rows if key(r)[0] is True]
    both = [r["diff"] for r in rows if r["diff"] is not None]
    return {
        "rows": rows[offset : offset + limit], "total": len(rows), "offset": offset,
        "limit": limit, "sort": sort, "order": order,
        "a": {**sel_a.describe(), "episodes": na, "tasks": len(ta), "mean": _mean(ta)},
        "b": {**sel_b.describe(), "episodes": nb, "tasks": len(tb), "mean": _mean(tb)},
        "both": len(both),
        "worse": sum(1 for d in both if d < -SAME_EPS),
        "better": sum(1 for d in both if d > SAME_EPS),
        "same": sum(1 for d in both if abs(d) <= SAME_EPS),
        "mean_diff": (sum(both) / len(both)) if both else None,
    }

