"""The parse step of an Anthropic Messages turn: the request translated to chat completions
(also what ``count_tokens`` counts). Its answer side is mixed in from ``_anthropic_render``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from ..trace import Endpoint
from ._adapter import Adapter, up_from_dict
from ._anthropic_render import AnthropicReplies
from ._http import BadRequest, Dialect
from ._request import HarnessRequest
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

__all__ = ["AnthropicAdapter"]

def _text(content: Any, where: str) -> str:
    """A string, or the text of a list of text blocks (other block kinds are refused)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        fail(where, f"must be a string or an array of text blocks, got {type_name(content)}")
    out = []
    for j, b in enumerate(content):
        w = f"{where}[{j}]"
        if not isinstance(b, dict) or b.get("type") != "text":
            fail(w, "must be a text block")
        out.append(req_str(b, "text", w))
    return "".join(out)


def _result_text(content: Any, where: str) -> str:
    """A tool_result's content: a string or blocks, whose text is kept (images dropped, as
    a chat tool message holds text)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        fail(where, f"must be a string or an array of blocks, got {type_name(content)}")
    out = []
    for j, b in enumerate(content):
        w = f"{where}[{j}]"
        if not isinstance(b, dict) or not isinstance(b.get("type"), str):
            fail(w, "must be a content block (an object with a string type)")
        if b["type"] == "text":
            out.append(req_str(b, "text", w))
    return "".join(out)


def _image(block: dict[str, Any], where: str) -> dict[str, Any]:
    src = block.get("source")
    w = f"{where}.source"
    if not isinstance(src, dict):
        fail(w, f"must be an object, got {type_name(src)}")
    kind = req_str(src, "type", w)
    if kind == "base64":
        url = f"data:{opt_str(src, 'media_type', w, 'image/png')};base64,{req_str(src, 'data', w)}"
    elif kind == "url":
        url = req_str(src, "url", w)
    else:
        fail(f"{w}.type", f"unsupported image source type {kind!r}")
    return {"type": "image_url", "image_url": {"url": url}}


def _assistant(content: list[Any], where: str, tool_args: Mapping[str, str] | None
               ) -> dict[str, Any]:
    texts, calls = [], []
    for j, b in enumerate(content):
        w = f"{where}[{j}]"
        if not isinstance(b, dict) or not isinstance(b.get("type"), str):
            fail(w, "must be a content block (an object with a string type)")
        t = b["type"]
        if t == "text":
            texts.append(req_str(b, "text", w))
        elif t == "tool_use":
            cid = req_str(b, "id", w)
            inp = b.get("input", {})
            if not isinstance(inp, dict):
                fail(f"{w}.input", f"must be an object, got {type_name(inp)}")
            check_depth(inp, f"{w}.input")
            # The text the model sampled, not a re-serialization of ``input``: the next
            # prompt then extends the recorded tokens.
            args = exact_arguments(cid, inp, tool_args) or orjson.dumps(inp).decode()
            calls.append({"id": cid, "type": "function", "function": {
                "name": req_str(b, "name", w), "arguments": args}})
        # thinking and server-tool blocks are not part of a chat assistant message
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
    if calls:
        msg["tool_calls"] = calls
    return msg


def _user(content: list[Any], where: str, out: list[dict[str, Any]]) -> None:
    parts: list[dict[str, Any]] = []
    for j, b in enumerate(content):
        w = f"{where}[{j}]"
        t = b.get("type") if isinstance(b, dict) else None
        if t == "tool_result":
            out.append({"role": "tool", "tool_call_id": req_str(b, "tool_use_id", w),
                        "content": _result_text(b.get("content"), f"{w}.content")})
        elif t == "text":
            parts.append({"type": "text", "text": req_str(b, "text", w)})
        elif t == "image":
            parts.append(_image(b, w))
        else:
            fail(w, f"unsupported content block type {t!r}")
    if parts:
        only_text = all(p["type"] == "text" for p in parts)
        out.append({"role": "user",
                    "content": "".join(p["text"] for p in parts) if only_text else parts})


def _tools(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    tools = opt_list(body, "tools")
    if not tools:
        return None
    out = []
    for j, t in enumerate(tools):
        w = f"tools[{j}]"
        if not isinstance(t, dict):
            fail(w, f"must be an object, got {type_name(t)}")
        schema = t.get("input_schema", {"type": "object"})
        if not isinstance(schema, dict):
            fail(f"{w}.input_schema", f"must be an object, got {type_name(schema)}")
        check_depth(schema, f"{w}.input_schema")
        out.append({"type": "function", "function": {
            "name": req_str(t, "name", w), "description": opt_str(t, "description", w, ""),
            "parameters": schema}})
    return out


def _tool_choice(tc: Any) -> Any:
    if not isinstance(tc, dict):
        fail("tool_choice", f"must be an object, got {type_name(tc)}")
    kind = req_str(tc, "type", "tool_choice")
    simple = {"auto": "auto", "any": "required", "none": "none"}
    if kind in simple:
        return simple[kind]
    if kind != "tool":
        fail("tool_choice.type", f"unsupported tool choice {kind!r}")
    return {"type": "function", "function": {"name": req_str(tc, "name", "tool_choice")}}


def to_chat(body: dict[str, Any], tool_args: Mapping[str, str] | None = None
            ) -> dict[str, Any]:
    """The chat-completions request an Anthropic Messages request means; ``tool_args``
    (tool-call id -> the arguments text the model produced) restores echoed tool calls."""
    msgs = body.get("messages")
    if not isinstance(msgs, list):
        raise BadRequest(400, "'messages' must be a list")
    opt_int(body, "max_tokens")
    out: list[dict[str, Any]] = []
    system = body.get("system")
    if system is not None:
        text = _text(system, "system")
        if text:
            out.append({"role": "system", "content": text})
    for i, m in enumerate(msgs):
        where = f"messages[{i}]"
        role = m.get("role") if isinstance(m, dict) else None
        if role not in ("user", "assistant", "system"):
            raise BadRequest(400, f"{where}: each message needs role 'user', 'assistant' "
                                  "or 'system'")
        content = m.get("content")
        if role == "system":  # Claude Code puts system prompts inside the messages
            out.append({"role": "system", "content": _text(content, f"{where}.content")})
            continue
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        if not isinstance(content, list):
            fail(f"{where}.content", "must be a string or a list of blocks, got "
                                     f"{type_name(content)}")
        if role == "assistant":
            out.append(_assistant(content, f"{where}.content", tool_args))
        else:
            _user(content, f"{where}.content", out)
    chat: dict[str, Any] = {"model": opt_str(body, "model", "", ""), "messages": out}
    if "tracewire" in body:  # the built-in model's forcing extension travels as is
        check_depth(body["tracewire"], "tracewire")
        chat["tracewire"] = body["tracewire"]
    if body.get("max_tokens") is not None:
        chat["max_tokens"] = body["max_tokens"]
    for k in ("temperature", "top_p", "top_k"):
        if opt_number(body, k) is not None:
            chat[k] = body[k]
    if opt_bool(body, "stream") is not None:
        chat["stream"] = body["stream"]
    stops = opt_list(body, "stop_sequences")
    if stops:
        for j, x in enumerate(stops):
            if not isinstance(x, str):
                fail(f"stop_sequences[{j}]", f"must be a string, got {type_name(x)}")
        chat["stop"] = stops
    tools = _tools(body)
    if tools:
        chat["tools"] = tools
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    return chat


def parse(body: bytes, tool_args: Mapping[str, str] | None = None) -> HarnessRequest:
    """Parse and translate an Anthropic request body."""
    d = load_object(body)
    return up_from_dict(to_chat(d, tool_args), d, body)


class AnthropicAdapter(AnthropicReplies, Adapter):
    """Anthropic Messages, translated to chat completions upstream and back."""

    endpoint = Endpoint.MESSAGES
    dialect = Dialect.ANTHROPIC

    def parse(self, body: bytes, tool_args: Mapping[str, str] | None = None) -> HarnessRequest:
        return parse(body, tool_args)
