"""Typed records of a trace: messages, nodes, calls, spans, rewards and errors.

All are msgspec Structs, so encoding them is a C-level walk, not a pydantic validation.
They are declared ``gc=False``: a trace holds thousands of them and they only ever form
trees (a record never refers back to its owner), so the cyclic garbage collector has nothing
to find in them — tracking them made decoding a 1,000-turn episode ~2x slower in GC passes.
Don't store a record inside its own content (such a cycle would never be collected).
Schema evolution rules (see docs/SCHEMA.md): fields are only ever appended, always with a
default; a field is never reordered, renamed or retyped; bump ``SCHEMA_VERSION`` only for a
change old readers cannot ignore.
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = [
    "SCHEMA_VERSION",
    "Call",
    "ErrorInfo",
    "Link",
    "Message",
    "Node",
    "Reward",
    "Span",
    "ToolCall",
]

#: Version of the trace schema written by this build (carried by every encoded header).
SCHEMA_VERSION = 1


class ToolCall(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False):
    """One function call requested by the model; ``arguments`` is kept as the raw JSON text."""

    id: str
    name: str
    arguments: str = ""
    type: str = "function"


class Message(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False):
    """A chat message: role, content (text or content parts), tool calls, tool call id, name."""

    role: str
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    reasoning: str | None = None


class Link(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False):
    """A semantic link from one node to another (e.g. ``tool_result`` → the tool call)."""

    target: int
    type: str


class Node(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False):
    """One message in the trace's message graph and the token slice ``[start, end)`` it adds.

    ``parent`` is the index of the parent node (None for a root). ``sampled`` is true for
    messages the model generated. ``has_tokens`` is false when the upstream reported no token
    ids, so the slice is empty by honesty, not by accident. ``digest`` is a hash of the
    message used for incremental matching of later requests.
    """

    parent: int | None = None
    message: Message
    sampled: bool = False
    ts: float = 0.0
    start: int = 0
    end: int = 0
    # Tuples, not lists: a decoded node with no links then allocates nothing, and the
    # garbage collector never has to visit it (a list per node made thousands of tracked
    # objects per episode and slow full collections). Same wire form (an array).
    links: tuple[Link, ...] = ()
    has_tokens: bool = True
    digest: str = ""


class Span(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False):
    """A time interval in seconds since the epoch; ``end`` is None while it is open."""

    start: float
    end: float | None = None

    @property
    def duration(self) -> float | None:
        """Length in seconds, or None while open."""
        return None if self.end is None else self.end - self.start


class Call(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False):
    """One model exchange: what was asked, how it ended, and the node holding its answer."""

    model: str = ""
    endpoint: str = ""
    sampling: dict[str, Any] = msgspec.field(default_factory=dict)
    finish_reason: str | None = None
    usage: dict[str, int] = msgspec.field(default_factory=dict)
    span: Span | None = None
    error: str | None = None
    node: int | None = None
    prompt_node: int | None = None
    hooks: tuple[str, ...] = ()  # a tuple for the reason given on Node.links
    #: What the upstream reported about the call (``"malformed_tool_call"``: a tool call
    #: the model wrote did not parse and was returned as text).
    flags: tuple[str, ...] = ()


class Reward(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False):
    """A named reward's score and its weight in the total."""

    score: float
    weight: float = 1.0


class ErrorInfo(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False):
    """An error recorded on a trace or episode (never raised through the rollout)."""

    type: str
    message: str = ""
    phase: str | None = None
    ts: float = 0.0
