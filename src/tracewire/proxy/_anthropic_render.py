"""The render step of an Anthropic Messages turn: the chat outcome as a Messages answer, whole
(:class:`AnthropicReplies`, mixed into ``AnthropicAdapter``) or as the stream's events.
The request side is ``_anthropic``."""

from __future__ import annotations

import uuid
from typing import Any

import orjson

from ._adapter import Streamer
from ._http import Dialect, sse
from ._rawjson import RawSpan
from ._request import HarnessRequest
from ._turn_types import Outcome

__all__ = ["AnthropicReplies"]

#: Chat finish reasons as Messages stop reasons.
_STOP = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens",
         "content_filter": "refusal"}


def _blocks(out: Outcome) -> list[dict[str, Any]]:
    ch = out.choices[0] if out.choices else None
    blocks: list[dict[str, Any]] = []
    if ch is None:
        return blocks
    if ch.content:
        blocks.append({"type": "text", "text": ch.content})
    for tc in ch.tool_calls:
        try:
            args = orjson.loads(tc.arguments or "{}")
        except orjson.JSONDecodeError:
            args = {"_raw": tc.arguments}
        blocks.append({"type": "tool_use", "id": tc.id, "name": tc.name, "input": args})
    return blocks


def _usage(out: Outcome) -> dict[str, int]:
    return {"input_tokens": out.usage.get("prompt_tokens", 0),
            "output_tokens": out.usage.get("completion_tokens", 0)}


class _AnthropicStreamer(Streamer):
    dialect = Dialect.ANTHROPIC
    keepalive = sse({"type": "ping"}, "ping")

    def __init__(self, up: HarnessRequest) -> None:
        self.model = up.model
        self.id = "msg_" + uuid.uuid4().hex[:24]
        self.block = -1
        self.kind: str | None = None
        self.tool_index: int | None = None

    def start(self) -> bytes:
        return sse({"type": "message_start", "message": {
            "id": self.id, "type": "message", "role": "assistant", "model": self.model,
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0}}}, "message_start")

    def _open(self, kind: str, block: dict[str, Any]) -> bytes:
        b = self._close()
        self.block += 1
        self.kind = kind
        return b + sse({"type": "content_block_start", "index": self.block,
                        "content_block": block}, "content_block_start")

    def _close(self) -> bytes:
        if self.kind is None:
            return b""
        self.kind = None
        return sse({"type": "content_block_stop", "index": self.block}, "content_block_stop")

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return sse({"type": "content_block_delta", "index": self.block, "delta": delta},
                   "content_block_delta")

    def chunk(self, line: bytes, d: dict[str, Any], span: RawSpan | None = None) -> bytes:
        out = b""
        for ch in d.get("choices") or ():
            if ch.get("index", 0) != 0:
                continue
            delta = ch.get("delta") or {}
            text = delta.get("content")
            if isinstance(text, str) and text:
                if self.kind != "text":
                    out += self._open("text", {"type": "text", "text": ""})
                out += self._delta({"type": "text_delta", "text": text})
            for tc in delta.get("tool_calls") or ():
                idx = int(tc.get("index", 0))
                fn = tc.get("function") or {}
                if self.kind != "tool" or idx != self.tool_index:
                    self.tool_index = idx
                    out += self._open("tool", {"type": "tool_use", "id": str(tc.get("id", "")),
                                               "name": str(fn.get("name", "")), "input": {}})
                if fn.get("arguments"):
                    out += self._delta({"type": "input_json_delta",
                                        "partial_json": str(fn["arguments"])})
        return out

    def done(self, out: Outcome) -> bytes:
        ch = out.choices[0]
        return self._close() + sse({
            "type": "message_delta",
            "delta": {"stop_reason": _STOP.get(ch.finish_reason or "stop", "end_turn"),
                      "stop_sequence": None},
            "usage": _usage(out)}, "message_delta") + sse(
            {"type": "message_stop"}, "message_stop")


class AnthropicReplies:
    """The answer side of the Anthropic adapter: a Messages body or stream built from the
    chat outcome."""

    def reply(self, up: HarnessRequest, d: dict[str, Any], out: Outcome,
              raw: bytes | None) -> bytes:
        """The Messages answer for ``out`` (fresh message id; ``d`` and ``raw``, the chat
        body, are not relayed)."""
        ch = out.choices[0] if out.choices else None
        return orjson.dumps({
            "id": "msg_" + uuid.uuid4().hex[:24], "type": "message", "role": "assistant",
            "model": out.model or up.model, "content": _blocks(out),
            "stop_reason": _STOP.get((ch.finish_reason if ch else None) or "stop", "end_turn"),
            "stop_sequence": None, "usage": _usage(out)})

    def streamer(self, up: HarnessRequest) -> Streamer:
        """A streamer turning chat chunks into Messages stream events."""
        return _AnthropicStreamer(up)
