"""Completion text → assistant message: content, reasoning and tool calls, in the family's
grammar; whole (:func:`parse_completion`) or as the text streams (:class:`StreamParser`).

Reasoning is a leading ``<think>…</think>`` block (or everything up to ``</think>`` when the
generation prompt already opened it). Tool calls are Hermes/Qwen ``<tool_call>{json}
</tool_call>`` blocks, or Llama 3's bare ``{"name": …, "parameters": …}`` object(s). A call
that does not parse stays in the content as the text the model wrote, and is listed in
:attr:`ParsedCompletion.malformed` — never an exception.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

__all__ = ["ParsedCall", "ParsedCompletion", "parse_llama_calls",
           "parse_tool_json", "strip_stop"]

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"


@dataclass(slots=True)
class ParsedCall:
    """One tool call: ``arguments`` is JSON text (compact, as parsed)."""

    name: str
    arguments: str
    id: str = field(default_factory=lambda: "call_" + uuid.uuid4().hex[:24])

    def as_openai(self) -> dict[str, Any]:
        """The call as an OpenAI chat ``tool_calls`` entry."""
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(slots=True)
class ParsedCompletion:
    """The assistant message a completion's text holds; ``malformed`` lists the raw text of
    each tool call that did not parse (it also stays in ``content``)."""

    content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ParsedCall] = field(default_factory=list)
    malformed: list[str] = field(default_factory=list)

    def as_message(self) -> dict[str, Any]:
        """The OpenAI chat message (``reasoning_content`` for the reasoning, as vLLM does)."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning is not None:
            msg["reasoning_content"] = self.reasoning
        if self.tool_calls:
            msg["tool_calls"] = [c.as_openai() for c in self.tool_calls]
        return msg


def parse_tool_json(body: str) -> ParsedCall | None:
    """A call from a JSON object with ``name`` and ``arguments``/``parameters``, or None."""
    try:
        obj = orjson.loads(body.strip())
    except orjson.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = orjson.loads(args)
        except orjson.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    return ParsedCall(obj["name"], orjson.dumps(args).decode())


def parse_llama_calls(text: str) -> list[ParsedCall] | None:
    """Llama 3 calls: the whole text (after an optional ``<|python_tag|>``) is one JSON call
    or several separated by ``;``; None when it is not calls."""
    body = text.strip()
    if body.startswith(PYTHON_TAG):
        body = body[len(PYTHON_TAG):].strip()
    if not body.startswith("{"):
        return None
    one = parse_tool_json(body)
    if one is not None:
        return [one]
    calls = []
    for part in body.split(";"):
        if not part.strip():
            continue
        c = parse_tool_json(part)
        if c is None:
            return None
        calls.append(c)
    return calls or None


def strip_stop(text: str, stop_texts: Sequence[str]) -> str:
    """``text`` without the stop token text it ends with (the close the model emitted)."""
    for s in stop_texts:
        if s and text.endswith(s):
            return text[: -len(s)]
    return text
