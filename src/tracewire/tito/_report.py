"""A session's mismatch report: every branch of its trace against a canonical render.

Plain CPU work over a finished (or paused) trace: run it in a worker thread (linear in the
tokens, see :mod:`tracewire.tito._mismatch`). Reports run one at a time (a lock, so a burst
of sessions ending at once does not take every core); none holds the planner's lock, so
other sessions' turns go on meanwhile. A branch that holds no sampled node, or lacks
tokens, is skipped; at most ``max_branches`` (the newest) are compared, since each costs a
full render and a diff.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..trace import Message, Trace
from ._mismatch import mismatch_report
from ._render import PromptBuilder

__all__ = ["chat_dict", "session_report"]

_one_at_a_time = threading.Lock()


def chat_dict(m: Message) -> dict[str, Any]:
    """A trace message as the OpenAI chat message a template renders."""
    d: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.reasoning is not None:
        d["reasoning_content"] = m.reasoning
    if m.tool_calls:
        d["tool_calls"] = [{"id": t.id, "type": t.type or "function",
                            "function": {"name": t.name, "arguments": t.arguments}}
                           for t in m.tool_calls]
    if m.tool_call_id is not None:
        d["tool_call_id"] = m.tool_call_id
    if m.name is not None:
        d["name"] = m.name
    return d


def session_report(builder: PromptBuilder, trace: Trace, tools: Any = None, *,
                   max_branches: int = 64,
                   tools_of: Callable[[NDArray[np.int32]], Any] | None = None
                   ) -> dict[str, Any]:
    """``{"mismatch", "by_kind", "branches", "recorded_tokens", "canonical_tokens"}`` summed
    over the trace's branches (see :func:`~tracewire.tito.mismatch_report`), each rendered
    with ``tools_of(branch ids)`` (the tools it was rendered with) when given and known,
    else ``tools``."""
    by_kind: Counter[str] = Counter()
    mismatch = rec = canon = n = 0
    leaves = [i for i in trace.leaves() if trace.nodes[i].sampled][-max_branches:]
    # A leaf whose turn stopped by length ends without the close token its render adds.
    cut = {c.node for c in trace.calls if c.node is not None and c.finish_reason == "length"}
    for leaf in leaves:
        br = trace.branch(leaf)
        if not all(trace.nodes[i].has_tokens for i in br.nodes) or not len(br):
            continue
        msgs = [chat_dict(trace.nodes[i].message) for i in br.nodes]
        used = tools_of(br.ids) if tools_of is not None else None
        with _one_at_a_time:
            rep = mismatch_report(builder, br.ids, br.mask, msgs,
                                  used if used is not None else tools, cut=leaf in cut)
        by_kind.update(rep.by_kind)
        mismatch += rep.mismatch
        rec += rep.recorded_tokens
        canon += rep.canonical_tokens
        n += 1
    return {"mismatch": mismatch, "by_kind": dict(by_kind), "branches": n,
            "recorded_tokens": rec, "canonical_tokens": canon}
