"""The parse step of an OpenAI Responses turn: the request translated to chat completions.
Its answer side is mixed in from ``_responses_render``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..trace import Endpoint
from ._adapter import Adapter, up_from_dict
from ._http import BadRequest, Dialect
from ._request import HarnessRequest
from ._responses_render import ResponsesReplies
from ._validate import (
    check_depth,
    exact_arguments,
    fail,
    load_object,
    opt_bool,
    opt_int,
    opt_list,
    opt_number,
    opt_str,
    req_str,
    type_name,
)

__all__ = ["ResponsesAdapter"]


def _parts(content: Any, where: str) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        fail(where, f"must be a string or a list of parts, got {type_name(content)}")
    parts: list[dict[str, Any]] = []
    for j, p in enumerate(content):
        w = f"{where}[{j}]"
        t = p.get("type") if isinstance(p, dict) else None
        if t in ("input_text", "output_text", "text"):
            parts.append({"type": "text", "text": req_str(p, "text", w)})
        elif t == "input_image":
            parts.append({"type": "image_url", "image_url": {"url": req_str(p, "image_url", w)}})
        else:
            fail(w, f"unsupported content part type {t!r}")
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def _call(it: dict[str, Any], where: str, tool_args: Mapping[str, str] | None
          ) -> dict[str, Any]:
    cid = req_str(it, "call_id", where)
    args = opt_str(it, "arguments", where, "")
    assert args is not None
    # Harnesses may re-serialize the arguments; the model's own text keeps the next
    # prompt extending the recorded tokens.
    args = exact_arguments(cid, args, tool_args) or args
    return {"id": cid, "type": "function", "function": {
        "name": req_str(it, "name", where), "arguments": args}}


def _items(inp: list[Any], msgs: list[dict[str, Any]], tool_args: Mapping[str, str] | None
           ) -> None:
    for i, it in enumerate(inp):
        where = f"input[{i}]"
        if not isinstance(it, dict):
            fail(where, "each input item must be an object")
        t = it.get("type", "message")
        if t == "message":
            role = it.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                fail(f"{where}.role", f"unsupported role {role!r}")
            msgs.append({"role": "system" if role == "developer" else role,
                         "content": _parts(it.get("content", ""), f"{where}.content")})
        elif t == "function_call":
            call = _call(it, where, tool_args)
            if msgs and msgs[-1]["role"] == "assistant":
                msgs[-1].setdefault("tool_calls", []).append(call)
            else:
                msgs.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif t == "function_call_output":
            out = it.get("output", "")
            msgs.append({"role": "tool", "tool_call_id": req_str(it, "call_id", where),
                         "content": out if isinstance(out, str) else _parts(
                             out, f"{where}.output")})
        elif t == "reasoning":
            continue
        else:
            fail(f"{where}.type", f"unsupported input item type {t!r}")


def _tools(body: dict[str, Any], dropped: list[str]) -> list[dict[str, Any]]:
    """The function tools in chat form; the names of the others go into ``dropped``."""
    out = []
    for j, t in enumerate(opt_list(body, "tools") or ()):
        w = f"tools[{j}]"
        if not isinstance(t, dict):
            fail(w, f"must be an object, got {type_name(t)}")
        if t.get("type") != "function":
            # Hosted tools (web_search, ...), namespaces of tools (Codex's multi_agent_v1)
            # and custom tools have no chat equivalent: recorded as not forwarded.
            name = t.get("name") if isinstance(t.get("name"), str) else t.get("type")
            dropped.append(name if isinstance(name, str) and name else f"tools[{j}]")
            continue
        params = t.get("parameters") or {"type": "object"}
        if not isinstance(params, dict):
            fail(f"{w}.parameters", f"must be an object, got {type_name(params)}")
        check_depth(params, f"{w}.parameters")
        out.append({"type": "function", "function": {
            "name": req_str(t, "name", w), "description": opt_str(t, "description", w, ""),
            "parameters": params}})
    return out


def to_chat(body: dict[str, Any], tool_args: Mapping[str, str] | None = None,
            dropped: list[str] | None = None) -> dict[str, Any]:
    """The chat-completions request a Responses request means; ``tool_args`` (tool-call id
    -> the arguments text the model produced) restores echoed tool calls; the names of tools
    that cannot be forwarded are appended to ``dropped``."""
    if body.get("previous_response_id"):
        raise BadRequest(400, "previous_response_id is not supported; send the full input")
    # Echoed in every reply (see _responses_render._response): they must encode.
    for k in ("tools", "tool_choice"):
        check_depth(body.get(k), k)
    meta = body.get("metadata")
    if meta is not None and not (isinstance(meta, dict) and all(
            isinstance(v, str) for v in meta.values())):
        fail("metadata", "must be an object of strings")
    msgs: list[dict[str, Any]] = []
    instructions = opt_str(body, "instructions", "")
    if instructions:
        msgs.append({"role": "system", "content": instructions})
    inp = body.get("input")
    if isinstance(inp, str):
        msgs.append({"role": "user", "content": inp})
    elif isinstance(inp, list):
        _items(inp, msgs, tool_args)
    else:
        raise BadRequest(400, "'input' must be a string or a list of items")
    chat: dict[str, Any] = {"model": opt_str(body, "model", "", ""), "messages": msgs}
    if "tracewire" in body:  # the built-in model's forcing extension travels as is
        check_depth(body["tracewire"], "tracewire")
        chat["tracewire"] = body["tracewire"]
    if opt_int(body, "max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    for k in ("temperature", "top_p"):
        if opt_number(body, k) is not None:
            chat[k] = body[k]
    for k in ("stream", "parallel_tool_calls"):
        if opt_bool(body, k) is not None:
            chat[k] = body[k]
    tools = _tools(body, [] if dropped is None else dropped)
    if tools:
        chat["tools"] = tools
    tc = body.get("tool_choice")
    if isinstance(tc, str):
        chat["tool_choice"] = tc
    elif isinstance(tc, dict):
        if tc.get("name") is not None:
            chat["tool_choice"] = {"type": "function", "function": {
                "name": req_str(tc, "name", "tool_choice")}}
        elif isinstance(tc.get("type"), str) and tc["type"] in ("auto", "none", "required"):
            chat["tool_choice"] = tc["type"]
    elif tc is not None:
        fail("tool_choice", f"must be a string or an object, got {type_name(tc)}")
    return chat


def parse(body: bytes, tool_args: Mapping[str, str] | None = None) -> HarnessRequest:
    """Parse and translate a Responses request body."""
    d = load_object(body)
    dropped: list[str] = []
    up = up_from_dict(to_chat(d, tool_args, dropped), d, body)
    up.unforwarded = dropped
    return up


class ResponsesAdapter(ResponsesReplies, Adapter):
    """OpenAI Responses, translated to chat completions upstream and back."""

    endpoint = Endpoint.RESPONSES
    dialect = Dialect.OPENAI

    def parse(self, body: bytes, tool_args: Mapping[str, str] | None = None) -> HarnessRequest:
        return parse(body, tool_args)
