"""Anthropic Messages <-> chat completions: requests, replies, stream events, token counts."""

from __future__ import annotations

import uuid
from typing import Any

import aiohttp
import orjson

from .._errors import ProxyError
from ._dialect import Adapter, Streamer, UpReq, up_from_dict
from ._graph import Outcome
from ._http import BadRequest, sse
from ._rawjson import RawSpan

__all__ = ["AnthropicAdapter", "count_tokens_request"]

_STOP = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens",
         "content_filter": "refusal"}


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(b.get("text", "")) for b in content
                       if isinstance(b, dict) and b.get("type") == "text")
    return ""


def _image(block: dict[str, Any]) -> dict[str, Any]:
    src = block.get("source") or {}
    if src.get("type") == "base64":
        url = f"data:{src.get('media_type', 'image/png')};base64,{src.get('data', '')}"
    else:
        url = str(src.get("url", ""))
    return {"type": "image_url", "image_url": {"url": url}}


def to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """The chat-completions request an Anthropic Messages request means."""
    msgs = body.get("messages")
    if not isinstance(msgs, list):
        raise BadRequest(400, "'messages' must be a list")
    if not isinstance(body.get("max_tokens", 0), int):
        raise BadRequest(400, "'max_tokens' must be an integer")
    out: list[dict[str, Any]] = []
    system = body.get("system")
    if system:
        out.append({"role": "system", "content": _text(system)})
    for m in msgs:
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise BadRequest(400, "each message needs role 'user' or 'assistant'")
        role, content = m["role"], m.get("content")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        if not isinstance(content, list):
            raise BadRequest(400, "message content must be a string or a list of blocks")
        if role == "assistant":
            texts, calls = [], []
            for b in content:
                t = b.get("type") if isinstance(b, dict) else None
                if t == "text":
                    texts.append(str(b.get("text", "")))
                elif t == "tool_use":
                    calls.append({"id": str(b.get("id", "")), "type": "function", "function": {
                        "name": str(b.get("name", "")),
                        "arguments": orjson.dumps(b.get("input", {})).decode()}})
            msg: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
            continue
        parts: list[dict[str, Any]] = []
        for b in content:
            t = b.get("type") if isinstance(b, dict) else None
            if t == "tool_result":
                out.append({"role": "tool", "tool_call_id": str(b.get("tool_use_id", "")),
                            "content": _text(b.get("content", ""))})
            elif t == "text":
                parts.append({"type": "text", "text": str(b.get("text", ""))})
            elif t == "image":
                parts.append(_image(b))
            else:
                raise BadRequest(400, f"unsupported content block type {t!r}")
        if parts:
            only_text = all(p["type"] == "text" for p in parts)
            out.append({"role": "user",
                        "content": "".join(p["text"] for p in parts) if only_text else parts})
    chat: dict[str, Any] = {"model": body.get("model", ""), "messages": out}
    if "tracewire" in body:  # the built-in model's forcing extension travels as is
        chat["tracewire"] = body["tracewire"]
    if "max_tokens" in body:
        chat["max_tokens"] = body["max_tokens"]
    for k in ("temperature", "top_p", "top_k", "stream"):
        if k in body:
            chat[k] = body[k]
    if body.get("stop_sequences"):
        chat["stop"] = body["stop_sequences"]
    tools = body.get("tools")
    if tools:
        chat["tools"] = [{"type": "function", "function": {
            "name": t.get("name"), "description": t.get("description", ""),
            "parameters": t.get("input_schema", {"type": "object"})}} for t in tools]
    tc = body.get("tool_choice")
    if isinstance(tc, dict):
        kind = tc.get("type")
        chat["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}.get(
            str(kind), {"type": "function", "function": {"name": tc.get("name")}})
    return chat


def parse(body: bytes) -> UpReq:
    """Parse and translate an Anthropic request body."""
    try:
        d = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(400, f"malformed JSON body: {exc}") from exc
    if not isinstance(d, dict):
        raise BadRequest(400, "the body must be a JSON object")
    return up_from_dict(to_chat(d), d, body)


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
    dialect = "anthropic"
    keepalive = sse({"type": "ping"}, "ping")

    def __init__(self, up: UpReq) -> None:
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


class AnthropicAdapter(Adapter):
    """Anthropic Messages, translated to chat completions upstream and back."""

    endpoint = "messages"
    dialect = "anthropic"

    def parse(self, body: bytes) -> UpReq:
        return parse(body)

    def reply(self, up: UpReq, d: dict[str, Any], out: Outcome, raw: bytes | None) -> bytes:
        ch = out.choices[0] if out.choices else None
        return orjson.dumps({
            "id": "msg_" + uuid.uuid4().hex[:24], "type": "message", "role": "assistant",
            "model": out.model or up.model, "content": _blocks(out),
            "stop_reason": _STOP.get((ch.finish_reason if ch else None) or "stop", "end_turn"),
            "stop_sequence": None, "usage": _usage(out)})

    def streamer(self, up: UpReq) -> Streamer:
        return _AnthropicStreamer(up)


async def count_tokens_request(client: aiohttp.ClientSession, upstream: str, up: UpReq,
                               headers: dict[str, str]) -> int:
    """Prompt tokens of a request: the upstream's ``/tokenize`` (vLLM) when it has one,
    otherwise a one-token generation's ``usage.prompt_tokens``."""
    body = up.as_dict()
    root = upstream[:-3] if upstream.endswith("/v1") else upstream
    req = {"model": body.get("model", ""), "messages": body["messages"],
           "add_generation_prompt": True}
    if body.get("tools"):
        req["tools"] = body["tools"]
    try:
        async with client.post(root + "/tokenize", json=req, headers=headers) as r:
            if r.status == 200:
                d = await r.json()
                if isinstance(d, dict) and isinstance(d.get("count"), int):
                    return int(d["count"])
        probe = {**{k: v for k, v in body.items() if k != "stream"}, "max_tokens": 1}
        async with client.post(upstream + "/chat/completions", json=probe,
                               headers=headers) as r:
            d = await r.json(content_type=None)
            if r.status == 200 and isinstance(d, dict):
                return int(d.get("usage", {}).get("prompt_tokens", 0))
            raise ProxyError(f"upstream cannot count tokens (status {r.status})")
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise ProxyError(f"upstream cannot count tokens: {exc}") from exc
