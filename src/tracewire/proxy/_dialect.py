"""The parse step of an OpenAI chat turn: :class:`ChatAdapter` turns a chat-completions body
into a :class:`~tracewire.proxy._request.HarnessRequest`, split without decoding its
messages, and spliced onto the session's last request when it extends it byte for byte.
Its answer side is mixed in from ``_render``; the translated dialects parse in ``_anthropic``
and ``_responses``, all against the interface in ``_adapter``."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import msgspec

from ..trace import Endpoint
from ._adapter import SAMPLING_KEYS, Adapter, Spliced, read_values
from ._http import BadRequest, Dialect
from ._rawjson import SENTINEL_JSON, RawSpan, find_value, skip_ws
from ._render import ChatReplies
from ._request import HarnessRequest
from ._turn_types import RequestCache
from ._validate import load_json

__all__ = ["ChatAdapter", "parse_chat_bytes", "parse_spliced", "splice_chat"]

_Top = dict[str, msgspec.Raw]
_decode_top = msgspec.json.Decoder(_Top).decode
_decode_list = msgspec.json.Decoder(list[msgspec.Raw]).decode
_CLOSE = 0x5D


#: The top-level values the chat parse reads (a body holds few of them: each present key
#: is looked up here once rather than each name in the body).
_READ = frozenset(("stream", "model", *SAMPLING_KEYS, "return_token_ids", "stream_options"))


def _finish(up: HarnessRequest, tb: dict[str, bytes | memoryview]) -> HarnessRequest:
    # Decoded here, so the shared reader is handed plain values rather than a callback
    # into this module (a step's helper never calls back into the step).
    vals = {k: load_json(v, k) for k, v in tb.items() if k in _READ}
    read_values(up, vals)
    up.want_ids = bool(vals.get("return_token_ids"))
    up.want_logprobs = bool(vals.get("logprobs"))
    opts = vals.get("stream_options")
    up.want_usage = isinstance(opts, dict) and bool(opts.get("include_usage"))
    rest = b"".join([tb[k] for k in sorted(tb) if k != "messages"])
    up.retry_material = up.hasher.digest() + rest
    return up


def _messages_span(body: bytes, raw: bytes | memoryview) -> RawSpan | None:
    """Where the top-level messages array ``raw`` lies in ``body`` (None if not found)."""
    j = find_value(body, b"messages")
    if j < 0 or not body.startswith(raw, j):
        return None
    return RawSpan(body, j, j + len(raw))


def parse_chat_bytes(body: bytes) -> HarnessRequest:
    """Split a chat-completions body without decoding the messages (the fast path)."""
    try:
        top = _decode_top(body)
        if "messages" not in top:
            raise BadRequest(400, "'messages' is required")
        raws = _decode_list(top["messages"])
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise BadRequest(400, f"malformed JSON body: {exc}") from exc
    except RecursionError as exc:  # msgspec walks nesting on the C stack
        raise BadRequest(400, "malformed JSON body: nested too deep") from exc
    tb: dict[str, bytes | memoryview] = {k: bytes(v) for k, v in top.items()}
    rb = list(map(bytes, raws))
    # Raw JSON values delimit themselves: their concatenation identifies the list.
    hasher = hashlib.blake2b(b"".join(rb), digest_size=16)
    up = HarnessRequest(top=tb, raws=rb, hasher=hasher,
               msgs_span=_messages_span(body, tb["messages"]), raw_body=body)
    return _finish(up, tb)


def splice_chat(body: bytes, cache: RequestCache | None) -> Spliced | None:
    """Cheap check (a find and a memcmp) that ``body``'s messages array begins with the
    cached request's messages, byte for byte, at a message boundary."""
    if cache is None:
        return None
    j = find_value(body, b"messages")
    c = cache.raw
    if j < 0 or not body.startswith(memoryview(c.data)[c.start:cache.stop], j):
        return None
    p = skip_ws(body, j + cache.stop - c.start)
    if p >= len(body) or body[p] not in b",]":
        return None
    return Spliced(body, body[:j] + b"[" + SENTINEL_JSON + body[p:], j, p, cache)


def parse_spliced(sp: Spliced) -> HarnessRequest | None:
    """Parse a spliced body: only the new messages are split and hashed. None when the
    placeholder is not the first top-level message (the caller parses the full body)."""
    try:
        top = _decode_top(sp.rest)
        mraw = top.get("messages")
        raws = _decode_list(mraw) if mraw is not None else []
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return None
    if not raws or bytes(raws[0]) != SENTINEL_JSON or mraw is None:
        return None
    end = sp.after + len(mraw) - 1 - len(SENTINEL_JSON)
    if sp.body[end - 1] != _CLOSE:
        return None
    tb: dict[str, bytes | memoryview] = {k: bytes(v) for k, v in top.items()}
    # A view: late in a session the array is ~150 KB, and it is only read again on the
    # slow paths (a mismatch, a hook, a re-join).
    tb["messages"] = memoryview(sp.body)[sp.start:end]
    rb = list(map(bytes, raws[1:]))
    hasher = sp.cache.hasher.copy()
    hasher.update(b"".join(rb))
    up = HarnessRequest(top=tb, raws=rb, hasher=hasher, extends=True,
               base=sp.cache.node, msgs_span=RawSpan(sp.body, sp.start, end),
               raw_body=sp.body)
    return _finish(up, tb)


class ChatAdapter(ChatReplies, Adapter):
    """OpenAI chat completions: passed through, token fields stripped when not asked for."""

    endpoint = Endpoint.CHAT
    dialect = Dialect.OPENAI

    def parse(self, body: bytes, tool_args: Mapping[str, str] | None = None) -> HarnessRequest:
        return parse_chat_bytes(body)  # passed through: the harness's own text is sent

    # The module's functions themselves: no method frame in between, every turn.
    splice = staticmethod(splice_chat)
    parse_spliced = staticmethod(parse_spliced)
