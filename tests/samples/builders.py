"""Build traces by hand the way the proxy records turns (docs/CONTRACTS.md)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from tracewire import Call, Message, Span, ToolCall, Trace


def prompt(
    trace: Trace, parent: int | None, msgs: Sequence[tuple[str, str]], ids: Sequence[int]
) -> int:
    """Append new prompt-side nodes; their tokens go on the LAST one. Returns its index."""
    last = parent
    for j, (role, text) in enumerate(msgs):
        is_last = j == len(msgs) - 1
        last = trace.add_node(
            Message(role=role, content=text),
            parent=last,
            ids=list(ids) if is_last else None,
        )
    assert last is not None
    return last


def complete(
    trace: Trace,
    prompt_node: int,
    ids: Sequence[int],
    logprobs: Sequence[float] | None,
    finish: str | None = "stop",
    *,
    tool: bool = False,
    span: tuple[float, float] | None = None,
    has_tokens: bool = True,
    notify: bool = True,
) -> int:
    """Append the completion node and its Call, then notify. Returns the completion node."""
    msg = Message(
        role="assistant",
        content="" if tool else "answer",
        tool_calls=[ToolCall(id="c1", name="f", arguments="{}")] if tool else None,
    )
    node = trace.add_node(
        msg,
        parent=prompt_node,
        sampled=True,
        ids=list(ids) if has_tokens else None,
        logprobs=list(logprobs) if logprobs is not None else None,
        has_tokens=has_tokens,
    )
    now = time.time()
    s = Span(start=span[0], end=span[1]) if span else Span(start=now, end=now)
    trace.add_call(
        Call(
            model="m",
            endpoint="chat",
            finish_reason=finish,
            node=node,
            prompt_node=prompt_node,
            span=s,
        )
    )
    if notify:
        trace.notify()
    return node


def fail(trace: Trace, prompt_node: int) -> None:
    """A failed call made from ``prompt_node`` (no completion node)."""
    trace.add_call(
        Call(
            model="m",
            endpoint="chat",
            error="upstream 500",
            prompt_node=prompt_node,
            finish_reason=None,
        )
    )
    trace.notify()


def golden(trace: Trace | None = None) -> Trace:
    """The issue's example: [1,2,3] → [10,11]; tool result [20,21]; → [30,31]."""
    t = trace or Trace()
    p1 = prompt(t, None, [("system", "s"), ("user", "u")], [1, 2, 3])
    c1 = complete(t, p1, [10, 11], [-0.125, -0.25], "tool_calls", tool=True)
    p2 = prompt(t, c1, [("tool", "r")], [20, 21])
    complete(t, p2, [30, 31], [-0.5, -1.0], "stop")
    return t
