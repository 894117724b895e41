"""The commit step of a turn: append what was asked and answered to the session's trace
(whole, without awaiting), or record the call as failed.

A turn's prompt tokens are the upstream's prompt ids past the matched path's tokens; when
those ids do not extend the path (a chat template that re-renders history differently) the
request becomes a new root branch and ``token_mismatches`` is counted, and when the request
only dropped a sampled answer (a history rewrite) it branches from the deepest ancestor the
ids do extend. Tokens the model did not see are never spliced in.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

from ..trace import Call, InfoKey, message_digest
from ._graph import TurnGraph
from ._prompt import PromptCache, PromptIds
from ._request import HarnessRequest
from ._session import Session
from ._turn_types import NewMessage, Outcome, Prepared, RequestCache

__all__ = ["append_turn", "commit", "fail"]


def commit(session: Session, up: HarnessRequest, prep: Prepared, out: Outcome, call: Call,
           flags: list[str]) -> None:
    """Append the turn to the session's trace and update the session's caches, counters
    and tool-call texts (``flags``: the upstream's facts about the call). Runs without
    awaiting, so a turn is committed whole or not at all."""
    graph = session.graph
    nodes = append_turn(graph, prep, out, call, up.all_messages)
    if flags and nodes:
        kept = tuple(dict.fromkeys(flags))
        for c in session.trace.calls[-len(nodes):]:
            c.flags = kept
    span = up.msgs_span
    if nodes and span is not None and up.hasher is not None:
        last = session.trace.nodes[nodes[0]].parent
        if last is not None:
            graph.request_cache = RequestCache(span, span.content_end(), last, up.hasher)
    session.turns += 1
    for ch in out.choices:
        for tc in ch.tool_calls:
            if tc.id:
                session.tool_args[tc.id] = tc.arguments
    total = out.usage.get("total_tokens")
    if total is None and out.prompt is not None:
        total = len(out.prompt) + max(
            (len(c.token_ids or ()) for c in out.choices), default=0)
    session.last_total_tokens = int(total or 0)


def append_turn(graph: TurnGraph, prep: Prepared, out: Outcome, call: Call,
                all_messages: Callable[[], list[NewMessage]]) -> list[int]:
    """Append a turn's new prompt nodes, one completion node per choice, and one Call per
    choice; returns the completion node indices. ``all_messages`` decodes the whole
    request (only needed when the history is re-rooted)."""
    parent, new = graph.match_rest(prep.parent, prep.new)
    prompt = out.prompt
    trace = graph.trace
    if prompt is None:
        for nm in new:
            parent = graph.add(nm, parent, has_tokens=False)
    else:
        rest = graph.extension(parent, prompt, bool(new))
        if rest is not None:
            for j, nm in enumerate(new):
                last = j == len(new) - 1
                parent = graph.add(nm, parent, ids=rest if last else rest[:0])
        else:
            full = graph.materialize(prompt)
            base = _rewritten_from(graph, parent, new, prompt)
            if base is None:
                # Re-tokenized history: the whole request becomes a new root.
                trace.info[InfoKey.TOKEN_MISMATCHES] = int(
                    trace.info.get(InfoKey.TOKEN_MISMATCHES, 0)) + 1
                rest_ids: NDArray[np.int32] | array[int] = full
                start, every = None, all_messages()
            else:
                trace.info[InfoKey.HISTORY_REWRITES] = int(
                    trace.info.get(InfoKey.HISTORY_REWRITES, 0)) + 1
                start, rest_ids = base
                every = all_messages()[graph.depth(start):]
            parent = start
            for j, nm in enumerate(every):
                last = j == len(every) - 1
                parent = graph.add(nm, parent, ids=rest_ids if last else rest_ids[:0])
        if prompt.raw is not None and parent is not None and len(prompt):
            # The path of ``parent`` now holds exactly this prompt's ids.
            graph.prompt_cache = PromptCache(prompt.raw, prompt.raw.content_end(), parent,
                                             len(prompt))
    nodes: list[int] = []
    for ch in out.choices:
        msg = ch.message()
        nm = NewMessage(msg, message_digest(msg), None)
        ids = ch.token_ids
        lps = ch.logprobs if ch.logprobs is not None and ids is not None and len(
            ch.logprobs) == len(ids) else None
        node = graph.add(
            nm, parent, sampled=True, ids=ids, logprobs=lps, has_tokens=ids is not None
        )
        nodes.append(node)
        graph.alias_answer(node)
        c = Call(
            model=out.model or call.model, endpoint=call.endpoint, sampling=call.sampling,
            finish_reason=ch.finish_reason, usage=dict(out.usage), span=call.span,
            node=node, prompt_node=parent, hooks=call.hooks, flags=call.flags,
        )
        trace.add_call(c)
    trace.pending = []
    trace.notify()
    return nodes


def _rewritten_from(graph: TurnGraph, parent: int | None, new: list[NewMessage],
                    prompt: PromptIds
                    ) -> tuple[int | None, NDArray[np.int32] | array[int]] | None:
    """When the request dropped a sampled answer from its history (the matched node was a
    turn's prompt, and the request goes on with another message instead of that answer):
    the deepest ancestor of ``parent`` whose tokens the prompt extends and the prompt's ids
    past it. None for a real mismatch (re-tokenized history)."""
    if parent is None or not new or new[0].message.role == "assistant":
        return None
    trace = graph.trace
    if not any(c.prompt_node == parent and c.node is not None for c in trace.calls):
        return None
    node: int | None = trace.nodes[parent].parent
    while True:
        ext = graph.extension(node, prompt, True)
        if ext is not None:
            return node, ext
        if node is None:
            return None
        node = trace.nodes[node].parent


def fail(graph: TurnGraph, call: Call, error: str, prompt_node: int | None = None) -> None:
    """Record a failed call (no completion node) made from ``prompt_node`` (the deepest
    node its request matched, None when unknown) and an error; nothing else is appended."""
    graph.trace.add_call(
        Call(model=call.model, endpoint=call.endpoint, sampling=call.sampling,
             span=call.span, error=error, hooks=call.hooks, finish_reason="error",
             prompt_node=prompt_node, flags=call.flags)
    )
    graph.trace.add_error("proxy", error, phase="agent")
    graph.trace.pending = []
    graph.trace.notify()
