"""OpenAI Responses <-> chat completions: requests, replies and stream events."""

from __future__ import annotations

import time
import uuid
from typing import Any

import orjson

from ._dialect import Adapter, Streamer, UpReq, up_from_dict
from ._graph import Outcome
from ._http import BadRequest, sse
from ._rawjson import RawSpan

__all__ = ["ResponsesAdapter"]


def _parts(content: Any) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(400, "message content must be a string or a list of parts")
    parts: list[dict[str, Any]] = []
    for p in content:
        t = p.get("type") if isinstance(p, dict) else None
        if t in ("input_text", "output_text", "text"):
            parts.append({"type": "text", "text": str(p.get("text", ""))})
        elif t == "input_image":
            parts.append({"type": "image_url", "image_url": {"url": str(p.get("image_url", ""))}})
        else:
            raise BadRequest(400, f"unsupported content part type {t!r}")
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """The chat-completions request a Responses request means."""
    if body.get("previous_response_id"):
        raise BadRequest(400, "previous_response_id is not supported; send the full input")
    msgs: list[dict[str, Any]] = []
    if body.get("instructions"):
        msgs.append({"role": "system", "content": str(body["instructions"])})
    inp = body.get("input")
    if isinstance(inp, str):
        msgs.append({"role": "user", "content": inp})
    elif isinstance(inp, list):
        for it in inp:
            if not isinstance(it, dict):
                raise BadRequest(400, "each input item must be an object")
            t = it.get("type", "message")
            if t == "message":
                role = it.get("role")
                if role not in ("user", "assistant", "system", "developer"):
                    raise BadRequest(400, f"unsupported role {role!r}")
                msgs.append({"role": "system" if role == "developer" else role,
                             "content": _parts(it.get("content", ""))})
            elif t == "function_call":
                call = {"id": str(it.get("call_id", "")), "type": "function", "function": {
                    "name": str(it.get("name", "")), "arguments": str(it.get("arguments", ""))}}
                if msgs and msgs[-1]["role"] == "assistant":
                    msgs[-1].setdefault("tool_calls", []).append(call)
                else:
                    msgs.append({"role": "assistant", "content": None, "tool_calls": [call]})
            elif t == "function_call_output":
                out = it.get("output", "")
                msgs.append({"role": "tool", "tool_call_id": str(it.get("call_id", "")),
                             "content": out if isinstance(out, str) else _parts(out)})
            elif t == "reasoning":
                continue
            else:
                raise BadRequest(400, f"unsupported input item type {t!r}")
    else:
        raise BadRequest(400, "'input' must be a string or a list of items")
    chat: dict[str, Any] = {"model": body.get("model", ""), "messages": msgs}
    if "tracewire" in body:  # the built-in model's forcing extension travels as is
        chat["tracewire"] = body["tracewire"]
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    for k in ("temperature", "top_p", "stream", "parallel_tool_calls"):
        if body.get(k) is not None:
            chat[k] = body[k]
    tools = [t for t in body.get("tools") or () if t.get("type") == "function"]
    if tools:
        chat["tools"] = [{"type": "function", "function": {
            "name": t.get("name"), "description": t.get("description") or "",
            "parameters": t.get("parameters") or {"type": "object"}}} for t in tools]
    tc = body.get("tool_choice")
    if isinstance(tc, str):
        chat["tool_choice"] = tc
    elif isinstance(tc, dict) and tc.get("name"):
        chat["tool_choice"] = {"type": "function", "function": {"name": tc["name"]}}
    return chat


def parse(body: bytes) -> UpReq:
    """Parse and translate a Responses request body."""
    try:
        d = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(400, f"malformed JSON body: {exc}") from exc
    if not isinstance(d, dict):
        raise BadRequest(400, "the body must be a JSON object")
    return up_from_dict(to_chat(d), d, body)


def _msg_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


def _fc_item(item_id: str, call_id: str, name: str, args: str, status: str) -> dict[str, Any]:
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name,
            "arguments": args, "status": status}


def _response(resp_id: str, up: UpReq, out: Outcome | None, output: list[dict[str, Any]],
              created: int) -> dict[str, Any]:
    orig = up.original or {}
    ch = out.choices[0] if out is not None and out.choices else None
    status = "in_progress" if out is None else (
        "incomplete" if ch is not None and ch.finish_reason == "length" else "completed")
    usage = None
    if out is not None:
        i, o = out.usage.get("prompt_tokens", 0), out.usage.get("completion_tokens", 0)
        usage = {"input_tokens": i, "input_tokens_details": {"cached_tokens": 0},
                 "output_tokens": o, "output_tokens_details": {"reasoning_tokens": 0},
                 "total_tokens": i + o}
    return {
        "id": resp_id, "object": "response", "created_at": created, "status": status,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete"
        else None,
        "instructions": orig.get("instructions"), "max_output_tokens":
        orig.get("max_output_tokens"), "model": (out.model if out else "") or up.model,
        "output": output, "parallel_tool_calls": orig.get("parallel_tool_calls", True),
        "previous_response_id": None, "reasoning": {"effort": None, "summary": None},
        "store": False, "temperature": orig.get("temperature"),
        "text": {"format": {"type": "text"}}, "tool_choice": orig.get("tool_choice", "auto"),
        "tools": orig.get("tools", []), "top_p": orig.get("top_p"), "truncation": "disabled",
        "usage": usage, "metadata": orig.get("metadata") or {},
    }


def _output(out: Outcome) -> list[dict[str, Any]]:
    ch = out.choices[0] if out.choices else None
    items: list[dict[str, Any]] = []
    if ch is None:
        return items
    if ch.content:
        items.append(_msg_item("msg_" + uuid.uuid4().hex[:24], ch.content, "completed"))
    for tc in ch.tool_calls:
        items.append(_fc_item("fc_" + uuid.uuid4().hex[:24], tc.id, tc.name, tc.arguments,
                              "completed"))
    return items


class _ResponsesStreamer(Streamer):
    def __init__(self, up: UpReq) -> None:
        self.up = up
        self.id = "resp_" + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.seq = 0
        self.items: list[dict[str, Any]] = []
        self.open: dict[str, Any] | None = None
        self.tool_index: int | None = None

    def _ev(self, type_: str, **fields: Any) -> bytes:
        ev = {"type": type_, "sequence_number": self.seq, **fields}
        self.seq += 1
        return sse(ev, type_)

    def start(self) -> bytes:
        r = _response(self.id, self.up, None, [], self.created)
        return self._ev("response.created", response=r) + self._ev(
            "response.in_progress", response=r)

    def _close(self) -> bytes:
        it = self.open
        if it is None:
            return b""
        self.open = None
        idx = len(self.items) - 1
        it["status"] = "completed"
        if it["type"] == "message":
            part = it["content"][0]
            b = self._ev("response.output_text.done", item_id=it["id"], output_index=idx,
                         content_index=0, text=part["text"])
            b += self._ev("response.content_part.done", item_id=it["id"], output_index=idx,
                          content_index=0, part=part)
        else:
            b = self._ev("response.function_call_arguments.done", item_id=it["id"],
                         output_index=idx, arguments=it["arguments"])
        return b + self._ev("response.output_item.done", output_index=idx, item=it)

    def _begin(self, item: dict[str, Any]) -> bytes:
        b = self._close()
        self.items.append(item)
        self.open = item
        shown = {**item, "content": []} if item["type"] == "message" else item
        b += self._ev("response.output_item.added", output_index=len(self.items) - 1,
                      item=orjson.loads(orjson.dumps(shown)))
        if item["type"] == "message":
            b += self._ev("response.content_part.added", item_id=item["id"],
                          output_index=len(self.items) - 1, content_index=0,
                          part={"type": "output_text", "text": "", "annotations": []})
        return b

    def chunk(self, line: bytes, d: dict[str, Any], span: RawSpan | None = None) -> bytes:
        out = b""
        for ch in d.get("choices") or ():
            if ch.get("index", 0) != 0:
                continue
            delta = ch.get("delta") or {}
            text = delta.get("content")
            if isinstance(text, str) and text:
                if self.open is None or self.open["type"] != "message":
                    out += self._begin(_msg_item("msg_" + uuid.uuid4().hex[:24], "",
                                                 "in_progress"))
                assert self.open is not None
                self.open["content"][0]["text"] += text
                out += self._ev("response.output_text.delta", item_id=self.open["id"],
                                output_index=len(self.items) - 1, content_index=0, delta=text)
            for tc in delta.get("tool_calls") or ():
                idx = int(tc.get("index", 0))
                fn = tc.get("function") or {}
                if self.open is None or self.open["type"] != "function_call" or (
                        idx != self.tool_index):
                    self.tool_index = idx
                    out += self._begin(_fc_item("fc_" + uuid.uuid4().hex[:24],
                                                str(tc.get("id", "")), str(fn.get("name", "")),
                                                "", "in_progress"))
                args = fn.get("arguments")
                if args:
                    assert self.open is not None
                    self.open["arguments"] += str(args)
                    out += self._ev("response.function_call_arguments.delta",
                                    item_id=self.open["id"], output_index=len(self.items) - 1,
                                    delta=str(args))
        return out

    def done(self, out: Outcome) -> bytes:
        b = self._close()
        r = _response(self.id, self.up, out, self.items, self.created)
        kind = "response.incomplete" if r["status"] == "incomplete" else "response.completed"
        return b + self._ev(kind, response=r)


class ResponsesAdapter(Adapter):
    """OpenAI Responses, translated to chat completions upstream and back."""

    endpoint = "responses"
    dialect = "openai"

    def parse(self, body: bytes) -> UpReq:
        return parse(body)

    def reply(self, up: UpReq, d: dict[str, Any], out: Outcome, raw: bytes | None) -> bytes:
        r = _response("resp_" + uuid.uuid4().hex[:24], up, out, _output(out), int(time.time()))
        return orjson.dumps(r)

    def streamer(self, up: UpReq) -> Streamer:
        return _ResponsesStreamer(up)
