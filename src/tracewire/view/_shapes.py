"""JSON shapes of episodes for the viewer: summaries, branch pages, timing, token windows.

Everything here is pure and runs in a worker thread (a 10,000-turn episode takes a few
milliseconds to summarize, too long for the event loop).
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
from numpy.typing import NDArray

from ..trace import Call, Episode, Message, Node, Trace

__all__ = [
    "MAX_LEAVES",
    "MAX_TEXT",
    "branch_page",
    "episode_summary",
    "live_row",
    "message_json",
    "signature",
    "timing",
    "token_window",
]

#: Leaves listed per trace in a summary (a wide tree lists the first ones and a count).
MAX_LEAVES = 500
#: Characters of one message text sent to the page; longer texts are cut and flagged.
MAX_TEXT = 200_000


def _b(obj: Any) -> Any:
    return msgspec.to_builtins(obj)


def _reward(rewards: dict[str, Any]) -> float:
    return float(sum(r.score * r.weight for r in rewards.values()))


def _leaves(trace: Trace) -> list[dict[str, Any]]:
    # Parents always precede children, so one forward pass gives every node's depth and
    # path token count (O(nodes), not O(leaves x depth) as walking each path would be).
    n = len(trace.nodes)
    depth = np.zeros(n, dtype=np.int64)
    ntok = np.zeros(n, dtype=np.int64)
    for i, node in enumerate(trace.nodes):
        size = node.end - node.start
        if node.parent is None:
            depth[i], ntok[i] = 1, size
        else:
            depth[i], ntok[i] = depth[node.parent] + 1, ntok[node.parent] + size
    return [
        {"leaf": leaf, "depth": int(depth[leaf]), "n_tokens": int(ntok[leaf]),
         "role": trace.nodes[leaf].message.role}
        for leaf in trace.leaves()[:MAX_LEAVES]
    ]


def trace_summary(index: int, trace: Trace) -> dict[str, Any]:
    """Everything about one trace except its nodes, calls and tokens (those are paged)."""
    n_leaves = len(trace.leaves())
    return {
        "index": index,
        "id": trace.id,
        "agent": trace.agent,
        "n_nodes": len(trace.nodes),
        "n_tokens": len(trace.columns),
        "n_calls": len(trace.calls),
        "n_leaves": n_leaves,
        "leaves": _leaves(trace),
        "rewards": _b(trace.rewards),
        "reward": _reward(trace.rewards),
        "metrics": trace.metrics,
        "info": trace.info,
        "stop": trace.stop,
        "completed": trace.completed,
        "ok": trace.ok,
        "errors": _b(trace.errors),
        "timing": _b(trace.timing),
        "pending": [message_json(m) for m in trace.pending],
        "extra": heat_columns(trace),
    }


def heat_columns(trace: Trace) -> list[str]:
    """Extra token columns the token view can colour by: one number per token."""
    out = []
    for name in trace.columns.extra_names():
        spec = trace.columns.spec(name)
        if spec is not None and spec[1] == () and spec[0].kind in "fiub":
            out.append(name)
    return out


def episode_summary(ep: Episode, *, live: bool) -> dict[str, Any]:
    """The episode page's header: identity, rewards, errors, timing and per-trace summaries."""
    return {
        "id": ep.id,
        "env": ep.env,
        "task_key": ep.task_key,
        "task": ep.task,
        "group_id": ep.group_id,
        "group_index": ep.group_index,
        "run": ep.run,
        "ok": ep.ok,
        "reward": ep.reward,
        "errors": _b(ep.errors),
        "timing": _b(ep.timing),
        "info": ep.info,
        "live": live,
        "traces": [trace_summary(i, t) for i, t in enumerate(ep.traces)],
    }


def live_row(ep: Episode) -> dict[str, Any]:
    """One line of the "running now" table."""
    return {
        "id": ep.id,
        "env": ep.env,
        "task_key": ep.task_key,
        "group_id": ep.group_id,
        "group_index": ep.group_index,
        "n_nodes": sum(len(t.nodes) for t in ep.traces),
        "n_tokens": sum(len(t.columns) for t in ep.traces),
        "n_calls": sum(len(t.calls) for t in ep.traces),
        "pending": sum(len(t.pending) for t in ep.traces),
        "reward": ep.reward,
    }


def signature(ep: Episode) -> tuple[Any, ...]:
    """Changes whenever anything a viewer shows of a live episode changes (append-only data
    means counts are enough; scalars are compared by their values)."""
    parts: list[Any] = [ep.ok, len(ep.errors), len(ep.traces), tuple(ep.timing)]
    for t in ep.traces:
        parts.append((
            len(t.nodes), len(t.columns), len(t.calls), len(t.errors), len(t.pending),
            t.stop, t.completed, t.ok, _reward(t.rewards), tuple(t.timing),
            tuple(s.end is not None for s in t.timing.values()),
        ))
    return tuple(parts)


def _text(s: str) -> tuple[str, bool]:
    return (s[:MAX_TEXT], True) if len(s) > MAX_TEXT else (s, False)


def message_json(m: Message) -> dict[str, Any]:
    """A message as the page shows it (long texts cut and flagged, binary parts named)."""
    d: dict[str, Any] = {"role": m.role}
    cut = False
    if isinstance(m.content, str):
        d["content"], cut = _text(m.content)
    elif isinstance(m.content, list):
        parts: list[dict[str, Any]] = []
        for p in m.content:
            kind = str(p.get("type", ""))
            if isinstance(p.get("text"), str):
                text, c = _text(p["text"])
                cut = cut or c
                parts.append({"type": kind or "text", "text": text})
            else:
                # Images and other binary parts are large and useless as text: name them only.
                parts.append({"type": kind or "part", "omitted": True})
        d["content"] = parts
    else:
        d["content"] = None
    if m.tool_calls:
        calls = []
        for tc in m.tool_calls:
            args, c = _text(tc.arguments)
            cut = cut or c
            calls.append({"id": tc.id, "name": tc.name, "arguments": args, "type": tc.type})
        d["tool_calls"] = calls
    if m.tool_call_id is not None:
        d["tool_call_id"] = m.tool_call_id
    if m.name is not None:
        d["name"] = m.name
    if m.reasoning is not None:
        d["reasoning"], c = _text(m.reasoning)
        cut = cut or c
    if cut:
        d["truncated"] = True
    return d


def _call(c: Call) -> dict[str, Any]:
    d: dict[str, Any] = {
        "model": c.model,
        "endpoint": c.endpoint,
        "finish_reason": c.finish_reason,
        "usage": c.usage,
        "error": c.error,
    }
    if c.span is not None:
        d["start"], d["end"] = c.span.start, c.span.end
    return d


def _node(index: int, node: Node, start: int, call: Call | None) -> dict[str, Any]:
    n = node.end - node.start
    return {
        "index": index,
        "parent": node.parent,
        "sampled": node.sampled,
        "ts": node.ts,
        "start": start,
        "end": start + n,
        "has_tokens": node.has_tokens,
        "links": _b(node.links),
        "message": message_json(node.message),
        "call": None if call is None else _call(call),
    }


def branch_page(trace: Trace, leaf: int, offset: int, limit: int) -> dict[str, Any]:
    """Nodes ``[offset, offset+limit)`` of the path root→``leaf``, with branch token offsets."""
    path = trace.path(leaf)
    sizes = np.fromiter(
        (trace.nodes[i].end - trace.nodes[i].start for i in path), dtype=np.int64, count=len(path)
    )
    starts = np.concatenate(([0], np.cumsum(sizes)))
    page = path[offset : offset + limit]
    wanted = set(page)
    by_node: dict[int, Call] = {}
    for c in trace.calls:
        if c.node is not None and c.node in wanted:
            by_node[c.node] = c
    nodes = [
        _node(i, trace.nodes[i], int(starts[offset + k]), by_node.get(i))
        for k, i in enumerate(page)
    ]
    return {
        "leaf": leaf,
        "n_nodes": len(path),
        "n_tokens": int(starts[-1]),
        "offset": offset,
        "limit": limit,
        "nodes": nodes,
        "pending": [message_json(m) for m in trace.pending] if leaf == len(trace.nodes) - 1 else [],
        "stop": trace.stop,
        "completed": trace.completed,
    }


def timing(ep: Episode, t: int) -> dict[str, Any]:
    """Phases (episode and trace spans) and model calls of trace ``t``, calls as columns."""
    trace = ep.traces[t]
    phases = [
        {"scope": scope, "name": k, "start": s.start, "end": s.end}
        for scope, spans in (("episode", ep.timing), ("trace", trace.timing))
        for k, s in spans.items()
    ]
    n = len(trace.calls)
    start = np.full(n, np.nan)
    end = np.full(n, np.nan)
    node = np.full(n, -1, dtype=np.int64)
    finish: list[str | None] = []
    for i, c in enumerate(trace.calls):
        if c.span is not None:
            start[i] = c.span.start
            if c.span.end is not None:
                end[i] = c.span.end
        if c.node is not None:
            node[i] = c.node
        finish.append("error" if c.error else c.finish_reason)
    return {
        "phases": phases,
        "calls": {"start": start, "end": end, "node": node, "finish": finish},
    }


def _le(arr: NDArray[Any], dtype: str) -> bytes:
    return np.ascontiguousarray(arr, dtype=np.dtype(dtype)).tobytes()


def token_window(cols: dict[str, NDArray[Any]], start: int, end: int, fmt: str,
                 *, kinds: bool = False) -> tuple[bytes | dict[str, Any], int]:
    """Tokens ``[start, end)`` of a branch: raw little-endian ``ids int32 | logprobs float32 |
    mask uint8``, then ``kind uint8`` when ``kinds`` and the extra column as ``float32``
    when ``cols`` has one (``fmt="bin"``), or compact JSON columns; returns (body, total)."""
    total = int(cols["ids"].shape[0])
    end = min(end, total)
    start = min(start, end)
    ids, lp, mask = (cols[k][start:end] for k in ("ids", "logprobs", "mask"))
    extra = cols.get("extra")
    if fmt == "bin":
        body = _le(ids, "<i4") + _le(lp, "<f4") + _le(mask, "u1")
        if kinds:
            body += _le(cols["kind"][start:end], "u1")
        if extra is not None:
            body += _le(extra[start:end], "<f4")
        return body, total
    out: dict[str, Any] = {
        "start": start,
        "end": end,
        "total": total,
        "ids": np.ascontiguousarray(ids),
        "mask": np.ascontiguousarray(mask),
        "logprobs": np.ascontiguousarray(lp),
    }
    if kinds:
        out["kind"] = np.ascontiguousarray(cols["kind"][start:end])
    if extra is not None:
        out["extra"] = np.ascontiguousarray(extra[start:end])
    return out, total
