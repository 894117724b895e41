"""The canonical digest of a chat message: what makes two messages the same turn.

One definition for every part that matches resent history: the proxy stores it in
``Node.digest`` (hex) and matches requests by it; token-in/token-out chains it over a
request's messages (raw bytes). Reasoning is excluded (harnesses often drop it when they
resend history), text-only part lists count as their joined text (chat templates render
them alike), and tool-call arguments are compared as JSON values, not as text (dialect
translation re-serializes them; Anthropic sends them back as an object).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from ._model import Message

__all__ = ["chat_message_digest", "hash16", "message_digest"]

# Copied per hash: the same digest as ``hashlib.blake2b(data, digest_size=16)`` without
# parsing the constructor's ten keyword parameters, the dearest part of hashing ~100 bytes.
_BLAKE16 = hashlib.blake2b(digest_size=16)


def hash16(data: bytes) -> bytes:
    """``hashlib.blake2b(data, digest_size=16).digest()``, cheaper (the canonical message
    digest, the key of the proxy's SDK-retry memory)."""
    h = _BLAKE16.copy()
    h.update(data)
    return h.digest()


_TEXT_PARTS = ("text", "input_text", "output_text")
_CANON = orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS


def _content(content: Any) -> Any:
    if content is None:
        return ""
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") in _TEXT_PARTS for p in content
    ):
        return "".join(str(p.get("text", "")) for p in content)
    return content


def _arguments(arguments: Any) -> str:
    # Sorted-key JSON text of the value; text that is not JSON stays as it is.
    value = arguments
    if isinstance(arguments, str):
        try:
            value = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return arguments
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def _digest(role: Any, content: Any, tool_calls: Iterable[tuple[str, str, Any]],
            tool_call_id: str | None, name: str | None) -> bytes:
    tcs = [(i, n, _arguments(a)) for i, n, a in tool_calls]
    canon = (role, _content(content), tcs, tool_call_id or "", name or "")
    return hash16(orjson.dumps(canon, option=_CANON))


def message_digest(msg: Message) -> str:
    """The canonical digest of ``msg`` as hex, the form ``Node.digest`` stores."""
    content = msg.content
    if not msg.tool_calls and (content is None or type(content) is str):
        # Text without tool calls (most messages): the canonical tuple below, built
        # directly (no generator, no per-field helpers), so the same bytes.
        return hash16(orjson.dumps((msg.role, content or "", [], msg.tool_call_id or "",
                                    msg.name or ""), option=_CANON)).hex()
    tcs = ((t.id, t.name, t.arguments) for t in msg.tool_calls or ())
    return _digest(msg.role, msg.content, tcs, msg.tool_call_id, msg.name).hex()


def chat_message_digest(m: Mapping[str, Any]) -> bytes:
    """The same digest (16 raw bytes) of an OpenAI chat message dict, without building a
    :class:`Message` (token-in/token-out hashes every resent message)."""
    tcs = []
    for tc in m.get("tool_calls") or ():
        fn = tc.get("function") or {}
        tcs.append((str(tc.get("id") or ""), str(fn.get("name") or ""),
                    fn.get("arguments", "")))
    return _digest(m.get("role"), m.get("content"), tcs, m.get("tool_call_id"), m.get("name"))
