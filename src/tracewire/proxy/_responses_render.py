"""The render step of an OpenAI Responses turn: the chat outcome as a Responses answer, whole
(:class:`ResponsesReplies`, mixed into ``ResponsesAdapter``) or as the stream's events.
The request side is ``_responses``."""

from __future__ import annotations

import time
import uuid
from typing import Any

import orjson

from ._adapter import Streamer
from ._http import sse
from ._rawjson import RawSpan
from ._request import HarnessRequest
from ._turn_types import Outcome

__all__ = ["ResponsesReplies"]


def _msg_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


def _fc_item(item_id: str, call_id: str, name: str, args: str, status: str) -> dict[str, Any]:
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name,
            "arguments": args, "status": status}


def _response(resp_id: str, up: HarnessRequest, out: Outcome | None, output: list[dict[str, Any]],
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
    def __init__(self, up: HarnessRequest) -> None:
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


class ResponsesReplies:
    """The answer side of the Responses adapter: a Responses body or stream built from the
    chat outcome, echoing the request's settings."""

    def reply(self, up: HarnessRequest, d: dict[str, Any], out: Outcome,
              raw: bytes | None) -> bytes:
        """The Responses answer for ``out`` (fresh ids; ``d`` and ``raw``, the chat body,
        are not relayed)."""
        r = _response("resp_" + uuid.uuid4().hex[:24], up, out, _output(out), int(time.time()))
        return orjson.dumps(r)

    def streamer(self, up: HarnessRequest) -> Streamer:
        """A streamer turning chat chunks into Responses stream events."""
        return _ResponsesStreamer(up)
