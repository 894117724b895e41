"""Hypothesis strategies that build random traces and episodes through the public API."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st

from tracewire import Call, Episode, Link, Message, Span, ToolCall, Trace

EXTRA_SPECS = [
    ("advantages", np.float32, ()),
    ("experts", np.uint8, (2, 3)),
    ("values", np.float64, ()),
    ("pos", np.int64, (2,)),
]

texts = st.text(max_size=40)
contents = st.one_of(
    st.none(),
    texts,
    st.lists(
        st.fixed_dictionaries({"type": st.just("text"), "text": texts}),
        max_size=2,
    ),
)
tool_calls = st.lists(
    st.builds(ToolCall, id=st.text(min_size=1, max_size=8), name=texts, arguments=texts),
    max_size=2,
)
messages = st.builds(
    Message,
    role=st.sampled_from(["system", "user", "assistant", "tool"]),
    content=contents,
    tool_calls=st.one_of(st.none(), tool_calls),
    tool_call_id=st.one_of(st.none(), texts),
    name=st.one_of(st.none(), texts),
)
finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**53), 2**53), finite, texts),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(texts, inner, max_size=3)
    ),
    max_leaves=8,
)


@st.composite
def token_block(draw: st.DrawFn, extras: list[tuple[str, Any, tuple[int, ...]]]) -> dict[str, Any]:
    n = draw(st.integers(0, 12))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    block: dict[str, Any] = {
        "ids": rng.integers(-(2**31), 2**31 - 1, size=n, dtype=np.int64).astype(np.int32),
        "mask": rng.integers(0, 2, size=n).astype(np.uint8),
        "logprobs": np.where(
            rng.random(n) < 0.3, np.nan, -rng.exponential(size=n)
        ).astype(np.float32),
    }
    chosen = [e for e in extras if draw(st.booleans())]
    block["extra"] = {
        name: (rng.standard_normal((n, *shape)) * 100).astype(dt) for name, dt, shape in chosen
    }
    return block


#: One mutation of a trace; applied by ``apply_op``.
ops = st.one_of(
    st.tuples(st.just("node"), st.integers(-1, 50), messages, st.booleans(), st.data()),
    st.tuples(st.just("call"), st.integers(0, 50), st.sampled_from(["stop", "length", None])),
    st.tuples(st.just("error"), texts, texts),
    st.tuples(st.just("timing"), st.sampled_from(["boot", "agent", "scoring"]), finite),
    st.tuples(st.just("reward"), texts, finite, finite),
    st.tuples(st.just("metric"), texts, finite),
    st.tuples(st.just("info"), texts, json_values),
    st.tuples(st.just("stop"), st.one_of(st.none(), texts)),
    st.tuples(st.just("flags"), st.booleans(), st.booleans()),
    st.tuples(st.just("pending"), st.lists(messages, max_size=2)),
)


def apply_op(t: Trace, op: tuple[Any, ...], extras: list[tuple[str, Any, tuple[int, ...]]]) -> None:
    kind = op[0]
    if kind == "node":
        _, p, msg, sampled, data = op
        parent = None if p < 0 or not t.nodes else p % len(t.nodes)
        block = data.draw(token_block(extras))
        has = data.draw(st.booleans()) or len(block["ids"]) > 0
        links = (Link(target=parent, type="reply"),) if parent is not None else ()
        t.add_node(
            msg,
            parent=parent,
            sampled=sampled,
            ids=block["ids"] if has else None,
            mask=block["mask"],
            logprobs=block["logprobs"],
            extra=block["extra"] or None,
            links=links,
            has_tokens=has,
            digest=str(len(t.nodes)),
        )
    elif kind == "call":
        _, node, finish = op
        ref = node % len(t.nodes) if t.nodes else None
        t.add_call(
            Call(model="m", endpoint="chat", finish_reason=finish, node=ref,
                 span=Span(start=1.0, end=2.0), usage={"prompt_tokens": 3})
        )
    elif kind == "error":
        t.add_error(op[1], op[2], phase="agent")
    elif kind == "timing":
        t.timing[op[1]] = Span(start=op[2], end=op[2] + 1)
    elif kind == "reward":
        t.set_reward(op[1], op[2], op[3])
    elif kind == "metric":
        t.metrics[op[1]] = op[2]
    elif kind == "info":
        t.info[op[1]] = op[2]
    elif kind == "stop":
        t.stop = op[1]
    elif kind == "flags":
        t.completed, t.ok = op[1], op[2]
    elif kind == "pending":
        t.pending = list(op[1])


@st.composite
def extra_sets(draw: st.DrawFn) -> list[tuple[str, Any, tuple[int, ...]]]:
    return [e for e in EXTRA_SPECS if draw(st.booleans())]


@st.composite
def traces(draw: st.DrawFn, max_ops: int = 25) -> Trace:
    extras = draw(extra_sets())
    t = Trace(agent=draw(st.dictionaries(texts, json_values, max_size=2)))
    for name, dt, shape in extras:
        t.columns.add_column(name, dt, shape)
    for op in draw(st.lists(ops, max_size=max_ops)):
        apply_op(t, op, extras)
    return t


@st.composite
def episodes(draw: st.DrawFn) -> Episode:
    e = Episode(
        env=draw(texts),
        task_key=draw(texts),
        task=draw(st.dictionaries(texts, json_values, max_size=3)),
        group_id=draw(st.one_of(st.none(), texts)),
        group_index=draw(st.integers(0, 100)),
        run=draw(texts),
        traces=draw(st.lists(traces(max_ops=10), max_size=3)),
    )
    if draw(st.booleans()):
        e.add_error("boom", draw(texts), phase="setup")
    e.timing["total"] = Span(start=draw(finite))
    return e
