"""Streaming assembly: compute → truncate → merge of a trace's branches into samples.

:class:`SampleBuilder` watches a trace. When a turn commits it does O(new nodes + new calls)
bookkeeping: for every node the branch's token count up to it and the contiguous column runs
of its root path (so a branch is a handful of column slices, not a walk over its nodes); for
every model turn (a ``Call`` with a completion node) its prompt length, its end, its status
and the previous turn on the same path. Collecting samples then only walks those turn
records and slices the columns: O(tokens + turns), with no per-turn copies.

Why merging is exact here: a turn's prompt is the token path of its ``prompt_node`` and its
completion node hangs under that node, so a later turn on the same path extends every
earlier one token for token by construction; a prompt that did not extend (re-tokenization
mismatch) starts a new root in the trace and therefore another branch.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..trace import Trace
from ._hooks import (
    Picker,
    Postprocess,
    default_picker,
    default_postprocess,
    run_picker,
    run_postprocess,
)
from ._sample import ABORTED, COMPLETED, TRUNCATED, Sample, SampleStatus, status_of

__all__ = ["SampleBuilder"]

log = logging.getLogger("tracewire.samples")

_LOOP_BACKLOG = 1024  # most new nodes a commit watcher processes on the event loop
_LOOP_BACKLOG_TOKENS = 1 << 18  # most new tokens it processes there


@dataclass(slots=True, frozen=True)
class _Turn:
    node: int  # completion node
    call: int  # index in trace.calls
    start: int  # branch position where the completion begins (= prompt length)
    end: int  # branch position where it ends
    status: SampleStatus
    finish_reason: str | None
    prev: int  # completion node of the previous turn on this path, -1 for the first
    tokens_ok: bool  # every node on the path up to here carries token ids
    nan_logprobs: bool  # the completion lacks some logprob


@dataclass(slots=True)
class _Plan:
    leaf: int
    turns: list[tuple[_Turn, int]]  # (turn, kept end position)
    status: SampleStatus


class SampleBuilder:
    """Incremental per-trace sample assembly; :meth:`attach` keeps it current via
    ``trace.watch``, :meth:`samples` collects (thread-safe against concurrent commits)."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self._lock = threading.Lock()
        # Per node: branch token count through the node; the column run [rs, re) that ends
        # the node's root path and the node ending the run before it (-1: none).
        self._cum: list[int] = []
        self._rs: list[int] = []
        self._re: list[int] = []
        self._rp: list[int] = []
        self._tokens_ok: list[bool] = []
        self._last_turn: list[int] = []  # nearest turn node at or above, -1 if none
        self._has_child: list[bool] = []
        self._leaves: dict[int, None] = {}  # insertion-ordered set
        self._turns: dict[int, _Turn] = {}
        self._failed: dict[int, int] = {}  # prompt node -> failed calls made from it
        self._ncalls = 0
        self._lp0: NDArray[np.float32] = np.zeros(0, dtype=np.float32)
        self._lp_n = 0
        self._unwatch: Callable[[], None] | None = None

    # -- streaming side ------------------------------------------------------------------
    def attach(self, *, catch_up: bool = True) -> SampleBuilder:
        """Follow the trace's commits from now on (catching up first unless told not to:
        the next :meth:`samples` or :meth:`summary` call catches up anyway)."""
        if catch_up:
            self.update()
        if self._unwatch is None:
            self._unwatch = self.trace.watch(self._on_commit)
        return self

    def _on_commit(self, _trace: Trace) -> None:
        # Runs on the event loop: never wait for a collect holding the lock in a thread;
        # the bookkeeping is counter-based, so whoever takes the lock next catches up. A
        # large backlog (a builder attached late to a long trace) is left to the collect,
        # which runs in a worker thread.
        if (
            len(self.trace.nodes) - len(self._cum) > _LOOP_BACKLOG
            or len(self.trace.columns) - self._lp_n > _LOOP_BACKLOG_TOKENS
        ):
            return
        if self._lock.acquire(blocking=False):
            try:
                self._catch_up()
            finally:
                self._lock.release()

    def close(self) -> None:
        """Stop following the trace."""
        if self._unwatch is not None:
            self._unwatch()
            self._unwatch = None

    def update(self) -> None:
        """Process nodes and calls appended since the last update (O(new))."""
        with self._lock:
            self._catch_up()

    def _catch_up(self) -> None:
        self._add_nodes()
        self._add_calls()
        self._add_logprobs()

    def _add_logprobs(self) -> None:
        # The trainer's logprob column, kept as tokens arrive: the sampled logprob where the
        # mask is 1, 0 elsewhere (the trace keeps NaN there). Samples then slice it like the
        # ids and mask, so a collect copies nothing.
        cols = self.trace.columns
        n, done = len(cols), self._lp_n
        if n <= done:
            return
        if n > self._lp0.shape[0]:
            grown = np.empty(max(n, 2 * self._lp0.shape[0], 1024), dtype=np.float32)
            grown[:done] = self._lp0[:done]
            # Views handed out earlier keep the old buffer, whose rows never change.
            self._lp0 = grown
        dst = self._lp0[done:n]
        dst[:] = 0.0
        np.copyto(dst, cols.logprobs[done:n], where=cols.mask[done:n] != 0)
        self._lp_n = n

    def _add_nodes(self) -> None:
        nodes = self.trace.nodes
        cum, rs, re_, rp = self._cum, self._rs, self._re, self._rp
        for i in range(len(cum), len(nodes)):
            n = nodes[i]
            p = n.parent
            size = n.end - n.start
            if p is None:
                cum.append(size)
                rs.append(n.start)
                re_.append(n.end)
                rp.append(-1)
                self._tokens_ok.append(n.has_tokens)
                self._last_turn.append(-1)
            else:
                cum.append(cum[p] + size)
                if size == 0:
                    rs.append(rs[p])
                    re_.append(re_[p])
                    rp.append(rp[p])
                elif re_[p] == n.start:
                    rs.append(rs[p])
                    re_.append(n.end)
                    rp.append(rp[p])
                else:
                    rs.append(n.start)
                    re_.append(n.end)
                    rp.append(p)
                self._tokens_ok.append(n.has_tokens and self._tokens_ok[p])
                self._last_turn.append(self._last_turn[p])
                self._has_child[p] = True
                self._leaves.pop(p, None)
            self._has_child.append(False)
            self._leaves[i] = None

    def _add_calls(self) -> None:
        calls = self.trace.calls
        nodes = self.trace.nodes
        lp_col = self.trace.columns.logprobs
        for ci in range(self._ncalls, len(calls)):
            call = calls[ci]
            k = call.node
            if k is None:
                if call.prompt_node is not None:
                    self._failed[call.prompt_node] = self._failed.get(call.prompt_node, 0) + 1
                continue
            if not 0 <= k < len(self._cum) or k in self._turns:
                log.warning("call %d names node %r, which is unknown or taken; ignored", ci, k)
                continue
            node = nodes[k]
            p = node.parent
            start = self._cum[p] if p is not None else 0
            self._turns[k] = _Turn(
                node=k,
                call=ci,
                start=start,
                end=self._cum[k],
                status=status_of(call.finish_reason, call.error),
                finish_reason=call.finish_reason,
                prev=self._last_turn[p] if p is not None else -1,
                tokens_ok=self._tokens_ok[k],
                nan_logprobs=bool(np.isnan(lp_col[node.start : node.end]).any()),
            )
            self._last_turn[k] = k
            if self._has_child[k]:
                # The call came after nodes below it (unusual order): redo the descendants.
                lt = self._last_turn
                for i in range(k + 1, len(lt)):
                    q = nodes[i].parent
                    lt[i] = i if i in self._turns else (lt[q] if q is not None else -1)
        self._ncalls = len(calls)

    # -- summary -------------------------------------------------------------------------
    def candidates(self) -> list[int]:
        """Leaves whose branch holds at least one model turn, in creation order."""
        with self._lock:
            self._catch_up()
            return [leaf for leaf in self._leaves if self._last_turn[leaf] != -1]

    def summary(self) -> dict[str, Any]:
        """Counts for a session summary: turns, failed calls, tokens, nodes, branches."""
        with self._lock:
            self._catch_up()
            branches = sum(1 for leaf in self._leaves if self._last_turn[leaf] != -1)
            return {
                "turns": len(self._turns),
                "failed_calls": sum(self._failed.values()),
                "tokens": len(self.trace.columns),
                "nodes": len(self._cum),
                "branches": branches,
                "leaves": len(self._leaves),
            }

    # -- collect side ----------------------------------------------------------------------
    def samples(
        self,
        *,
        max_seq_len: int | None = None,
        picker: Picker | None = default_picker,
        postprocess: Postprocess | None = default_postprocess,
        metadata: Mapping[str, Any] | None = None,
        computed: Mapping[str, Any] | None = None,
        overrides: Mapping[str, Any] | None = None,
        group_id: str | None = None,
        group_index: int = 0,
    ) -> list[Sample]:
        """Samples of the kept leaves (see :func:`assemble`)."""
        if max_seq_len is not None and max_seq_len < 1:
            raise ValueError("max_seq_len must be a positive integer or None")
        trace = self.trace
        candidates = self.candidates()
        common: dict[str, Any] = {
            "trace_id": trace.id,
            "group_id": group_id,
            "group_index": group_index,
        }

        def meta(extra: Mapping[str, Any]) -> dict[str, Any]:
            out = dict(metadata or {})
            out.update(computed or {})
            out["trace_id"] = trace.id
            out.update(extra)
            out.update(overrides or {})
            return out

        if not candidates:
            return [Sample.empty("no_records", metadata=meta({"turns": 0}), **common)]

        kept = candidates
        if picker is not None:
            kept = run_picker(picker, trace, candidates)
        if not kept:
            return [Sample.empty("none_picked", metadata=meta({"turns": 0}), **common)]

        with self._lock:
            planned = [self._plan(leaf, max_seq_len) for leaf in kept]
        plans = [p for p, _ in planned if p is not None]
        if not plans:
            reasons = {r for _, r in planned}
            reason = "all_truncated" if "all_truncated" in reasons else "no_tokens"
            return [Sample.empty(reason, metadata=meta({"turns": 0}), **common)]

        out: list[Sample] = []
        for plan in plans:
            last, end = plan.turns[-1]
            tr0 = plan.turns[0][0]
            ids, mask, lp = self._gather(last.node, end, plan)
            spans = [(t.node, t.start, e) for t, e in plan.turns]
            out.append(
                Sample(
                    tokens=ids,
                    loss_mask=mask,
                    logprobs=lp,
                    status=plan.status,
                    prompt_len=tr0.start,
                    leaf=plan.leaf,
                    finish_reason=last.finish_reason,
                    metadata=meta(
                        {
                            "leaf": plan.leaf,
                            "turns": len(spans),
                            "status": plan.status,
                            "finish_reason": last.finish_reason,
                        }
                    ),
                    spans=spans,
                    **common,
                )
            )
        if postprocess is not None:
            out = run_postprocess(postprocess, trace, out)
            if not out:
                return [Sample.empty("none_picked", metadata=meta({"turns": 0}), **common)]
        return out

    def _plan(self, leaf: int, max_len: int | None) -> tuple[_Plan | None, str]:
        chain: list[_Turn] = []
        t = self._last_turn[leaf]
        while t != -1:
            turn = self._turns[t]
            chain.append(turn)
            t = turn.prev
        chain.reverse()
        kept: list[tuple[_Turn, int]] = []
        status = COMPLETED
        reason = ""
        for turn in chain:
            if not turn.tokens_ok:
                status, reason = ABORTED, "no_tokens"
                break
            if max_len is not None and turn.end > max_len:
                # Cut inside the completion if the overshoot fits there, else drop the turn.
                if turn.start < max_len:
                    kept.append((turn, max_len))
                status, reason = TRUNCATED, "all_truncated"
                break
            kept.append((turn, turn.end))
            if turn.status != COMPLETED:
                status = turn.status
                break
        else:
            if self._failed_after(leaf, chain[-1].node):
                status = ABORTED
        if not kept:
            return None, reason
        return _Plan(leaf=leaf, turns=kept, status=status), ""

    def _failed_after(self, leaf: int, last: int) -> bool:
        # A failed call made after the branch's last turn means the rollout was cut short.
        if not self._failed:
            return False
        nodes = self.trace.nodes
        m: int | None = leaf
        while m is not None:
            if m in self._failed:
                return True
            if m == last:
                return False
            m = nodes[m].parent
        return False

    def _gather(
        self, node: int, length: int, plan: _Plan
    ) -> tuple[NDArray[np.int32], NDArray[np.uint8], NDArray[np.float32] | None]:
        with self._lock:
            lp0 = self._lp0[: self._lp_n]
            runs: list[tuple[int, int]] = []
            m = node
            while m != -1:
                s, e = self._rs[m], self._re[m]
                if e > s:
                    runs.append((s, e))
                m = self._rp[m]
        runs.reverse()
        cut: list[tuple[int, int]] = []
        left = length
        for s, e in runs:
            if left <= 0:
                break
            take = min(e - s, left)
            cut.append((s, s + take))
            left -= take
        cols = self.trace.columns
        ids_c, mask_c, lp_c = cols.column("ids"), cols.column("mask"), cols.column("logprobs")
        ids = _take(ids_c, cut)
        mask = _take(mask_c, cut)
        nan = any(t.nan_logprobs for t, e in plan.turns if e == t.end)
        last, end = plan.turns[-1]
        if not nan and end != last.end:
            # The cut turn: only its kept part matters.
            s0 = cut[-1][1] - (end - last.start)
            nan = bool(np.isnan(lp_c[s0 : cut[-1][1]]).any())
        lp: NDArray[np.float32] | None = None
        if not nan:
            lp = _take(lp0, cut)
        return ids, mask, lp


def _take(col: NDArray[Any], cut: Sequence[tuple[int, int]]) -> NDArray[Any]:
    if len(cut) == 1:
        s, e = cut[0]
        out = col[s:e].view()
    elif not cut:
        out = col[0:0].view()
    else:
        out = np.concatenate([col[s:e] for s, e in cut])
    out.flags.writeable = False
    return out
