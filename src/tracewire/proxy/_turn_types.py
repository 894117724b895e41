"""The types one proxy turn passes from step to step (see ``_turn``): what matching found
(:class:`NewMessage`, :class:`Prepared`), what the upstream answered (:class:`Choice`,
:class:`Outcome`), the session's request cache, and the decoding of one chat message.

They hold data only; the steps that fill them live in their own modules, so any step may
use them without calling another step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from ..trace import Message, ToolCall
from ._prompt import PromptIds
from ._rawjson import RawSpan

__all__ = ["Choice", "NewMessage", "Outcome", "Prepared", "RequestCache",
           "chat_message"]


def chat_message(d: Any) -> Message:
    """A :class:`Message` from an OpenAI chat message dict (``ValueError`` if malformed)."""
    if not isinstance(d, dict) or not isinstance(d.get("role"), str):
        raise ValueError("each message must be an object with a string 'role'")
    content = d.get("content")
    if content is not None and not isinstance(content, str | list):
        raise ValueError("message content must be a string, a list of parts, or null")
    tool_calls = None
    raw_tcs = d.get("tool_calls")
    if raw_tcs:
        if not isinstance(raw_tcs, list):
            raise ValueError("tool_calls must be a list")
        tool_calls = []
        for tc in raw_tcs:
            fn = tc.get("function") if isinstance(tc, dict) else None
            if not isinstance(fn, dict):
                raise ValueError("each tool call needs a 'function' object")
            args = fn.get("arguments", "")
            tool_calls.append(
                ToolCall(
                    id=str(tc.get("id") or ""),
                    name=str(fn.get("name") or ""),
                    arguments=args if isinstance(args, str) else orjson.dumps(args).decode(),
                    type=str(tc.get("type") or "function"),
                )
            )
    reasoning = d.get("reasoning_content", d.get("reasoning"))
    return Message(
        role=d["role"],
        content=content,
        tool_calls=tool_calls,
        tool_call_id=d.get("tool_call_id"),
        name=d.get("name"),
        reasoning=reasoning if isinstance(reasoning, str) else None,
    )


# Not frozen: made several times a turn, and a frozen dataclass's __init__ costs 4x.
@dataclass(slots=True)
class RequestCache:
    """The last committed chat request's messages array (raw text, by reference), the node
    whose path holds exactly those messages, and a hash state over their raw bytes."""

    raw: RawSpan
    stop: int  # raw.data[raw.start:stop] is the array text before its closing bracket
    node: int
    hasher: Any  # hashlib.blake2b state after every message's raw bytes


@dataclass(slots=True)
class NewMessage:
    """A request message not found in the graph yet."""

    message: Message
    digest: str
    raw: bytes | None  # its raw JSON bytes (the fast-path key), when the dialect has them


@dataclass(slots=True)
class Prepared:
    """Result of matching a request: the matched parent and the messages to append."""

    parent: int | None
    new: list[NewMessage]


@dataclass(slots=True)
class Choice:
    """One completion as accumulated from the upstream (streamed or not)."""

    index: int = 0
    content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None

    def message(self) -> Message:
        """The assistant message this completion is."""
        return Message(
            role="assistant",
            content=self.content,
            tool_calls=list(self.tool_calls) or None,
            reasoning=self.reasoning,
        )


@dataclass(slots=True)
class Outcome:
    """What the upstream answered: model, prompt ids (if any), choices, usage."""

    model: str = ""
    prompt: PromptIds | None = None
    #: Where the prompt ids lie in the upstream's raw body when the parsed dict holds the
    #: placeholder instead (see ``_rawjson``).
    span: RawSpan | None = None
    choices: list[Choice] = field(default_factory=list)
    usage: dict[str, int] = field(default_factory=dict)


