"""Diff of two rollouts: where their conversations part, message by message, then token by token.

Each side is one branch (root to a leaf) of one trace. Messages are compared pairwise from
the root; the first unequal pair is where the conversations part (everything before it is
the shared prompt, sent once). Token ids are compared within sampled message pairs: the
first sampled pair whose ids differ, and the first differing position in it, is where the
policy's samples parted (this can come before the first unequal message, when the same
text was sampled as different ids). Around that token both continuations are sent with ids,
logprobs and mask. Pure and O(path): runs in a worker thread.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..trace import Episode, Trace
from ._shapes import message_json

__all__ = ["AFTER", "BEFORE", "MAX_SIDE", "diff_episodes", "side_info"]

#: Tokens of context sent before and after the first differing token.
BEFORE = 24
AFTER = 40
#: Messages sent per side after the shared prefix (and of the shared prefix itself).
MAX_SIDE = 400
#: Message pairs compared between two offers of the GIL to the event loop.
YIELD_EVERY = 128


def _starts(trace: Trace, path: list[int]) -> NDArray[np.int64]:
    sizes = np.fromiter((trace.nodes[i].end - trace.nodes[i].start for i in path),
                        dtype=np.int64, count=len(path))
    return np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)


def side_info(ep: Episode, t: int, leaf: int) -> dict[str, Any]:
    """Identity and outcome of one side."""
    tr = ep.traces[t]
    return {"id": ep.id, "trace": t, "leaf": leaf, "env": ep.env, "task_key": ep.task_key,
            "group_id": ep.group_id, "group_index": ep.group_index, "reward": ep.reward,
            "stop": tr.stop, "n_nodes": len(tr.path(leaf)) if leaf >= 0 else 0}  # fmt: skip


def _window(trace: Trace, path: list[int], start: int, end: int) -> dict[str, Any]:
    b = trace.branch(path[-1])
    ids, lp, mask = b.ids, b.logprobs, b.mask
    end = min(end, len(ids))
    start = max(0, min(start, end))
    return {"start": start, "end": end, "ids": ids[start:end].tolist(),
            "logprobs": [None if np.isnan(x) else float(x) for x in lp[start:end].tolist()],
            "mask": mask[start:end].tolist()}  # fmt: skip


def _first_diff(x: NDArray[Any], y: NDArray[Any]) -> int | None:
    if len(x) == len(y) and x.tobytes() == y.tobytes():
        return None  # the common case, without numpy's per-call overhead
    n = min(len(x), len(y))
    neq = np.flatnonzero(x[:n] != y[:n])
    if neq.size:
        return int(neq[0])
    return None if len(x) == len(y) else n


def diff_episodes(a: Episode, ta: int, leaf_a: int, b: Episode, tb: int, leaf_b: int
                  ) -> dict[str, Any]:
    """The diff of branch ``leaf_a`` of trace ``ta`` of ``a`` and ``leaf_b`` of ``tb`` of
    ``b`` (see the module docstring for its parts)."""
    tra, trb = a.traces[ta], b.traces[tb]
    pa = tra.path(leaf_a) if leaf_a >= 0 else []
    pb = trb.path(leaf_b) if leaf_b >= 0 else []
    n = min(len(pa), len(pb))
    first_msg: int | None = None
    tok: dict[str, Any] | None = None
    ids_a, ids_b = tra.columns.ids, trb.columns.ids
    for k in range(n):
        if k % YIELD_EVERY == YIELD_EVERY - 1:
            time.sleep(0)  # let the event loop's thread have the GIL between slices
        na, nb = tra.nodes[pa[k]], trb.nodes[pb[k]]
        if first_msg is None and (na.message != nb.message or na.sampled != nb.sampled):
            first_msg = k
        if tok is None and na.sampled and nb.sampled:
            p = _first_diff(ids_a[na.start : na.end], ids_b[nb.start : nb.end])
            if p is not None:
                tok = {"message": k, "node_a": pa[k], "node_b": pb[k], "offset": p}
        if first_msg is not None and tok is not None:
            break
    if first_msg is None and len(pa) != len(pb):
        first_msg = n
    shared = n if first_msg is None else first_msg
    sa, sb = _starts(tra, pa), _starts(trb, pb)
    if tok is not None:
        k = tok["message"]
        pos_a, pos_b = int(sa[k]) + tok["offset"], int(sb[k]) + tok["offset"]
        tok["pos_a"], tok["pos_b"] = pos_a, pos_b
        tok["a"] = _window(tra, pa, pos_a - BEFORE, pos_a + AFTER)
        tok["b"] = _window(trb, pb, pos_b - BEFORE, pos_b + AFTER)

    def messages(tr: Trace, path: list[int], starts: NDArray[np.int64], lo: int
                 ) -> list[dict[str, Any]]:
        out = []
        for k in range(lo, min(len(path), lo + MAX_SIDE)):
            if k % YIELD_EVERY == YIELD_EVERY - 1:
                time.sleep(0)
            node = tr.nodes[path[k]]
            out.append({"index": k, "node": path[k], "sampled": node.sampled,
                        "start": int(starts[k]), "end": int(starts[k + 1]),
                        "message": message_json(node.message)})
        return out

    shared_lo = max(0, shared - MAX_SIDE)
    return {
        "a": side_info(a, ta, leaf_a), "b": side_info(b, tb, leaf_b),
        "same_task": a.task_key == b.task_key and a.env == b.env,
        "identical": first_msg is None and tok is None,
        "shared": shared, "shared_from": shared_lo,
        "shared_messages": messages(tra, pa, sa, shared_lo)[: shared - shared_lo],
        "first_message": first_msg, "token": tok,
        "rest_a": messages(tra, pa, sa, shared), "rest_b": messages(trb, pb, sb, shared),
        "n_a": len(pa), "n_b": len(pb),
    }
