"""The parse step of a turn: endpoint adapters turn a harness request body into a
:class:`~tracewire.proxy._request.HarnessRequest` (OpenAI chat is split without decoding its
messages, and spliced onto the session's last request when it extends it byte for byte; see
``_anthropic`` and ``_responses`` for the translated dialects). Each adapter also renders
answers: the chat adapter's answer side lives in ``_render``."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from ..trace import Endpoint
from ._http import BadRequest, Dialect
from ._rawjson import SENTINEL_JSON, RawSpan, find_value, skip_ws
from ._render import ChatReplies, Streamer
from ._request import HarnessRequest
from ._turn_types import Outcome, RequestCache, raw_hash
from ._validate import check_depth, fail, load_json, type_name

__all__ = ["SAMPLING_KEYS", "Adapter", "ChatAdapter", "Spliced", "parse_chat_bytes",
           "up_from_dict"]

SAMPLING_KEYS = (
    "temperature", "top_p", "top_k", "min_p", "max_tokens", "max_completion_tokens", "n",
    "seed", "stop", "presence_penalty", "frequency_penalty", "repetition_penalty",
    "logprobs", "top_logprobs", "tool_choice",
)
_Top = dict[str, msgspec.Raw]
_decode_top = msgspec.json.Decoder(_Top).decode
_decode_list = msgspec.json.Decoder(list[msgspec.Raw]).decode
_CLOSE = 0x5D


def _scalars(up: HarnessRequest, get: Any) -> None:
    up.stream = bool(get("stream"))
    model = get("model")
    if model is not None and not isinstance(model, str):
        fail("model", f"must be a string, got {type_name(model)}")
    up.model = model or ""
    up.sampling = {k: v for k in SAMPLING_KEYS if (v := get(k)) is not None}
    for k, v in up.sampling.items():  # recorded on the Call
        check_depth(v, k)


def _finish(up: HarnessRequest, tb: dict[str, bytes]) -> HarnessRequest:
    def get(k: str) -> Any:
        v = tb.get(k)
        return None if v is None else load_json(v, k)

    _scalars(up, get)
    up.want_ids = bool(get("return_token_ids"))
    up.want_logprobs = bool(get("logprobs"))
    opts = get("stream_options")
    up.want_usage = isinstance(opts, dict) and bool(opts.get("include_usage"))
    rest = b"".join(v for k, v in sorted(tb.items()) if k != "messages")
    up.retry_material = up.hasher.digest() + rest
    return up


def _messages_span(body: bytes, raw: bytes) -> RawSpan | None:
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
    tb = {k: bytes(v) for k, v in top.items()}
    rb = [bytes(r) for r in raws]
    hashes = [raw_hash(r) for r in rb]
    hasher = hashlib.blake2b(b"".join(hashes), digest_size=16)
    up = HarnessRequest(top=tb, raws=rb, hashes=hashes, hasher=hasher,
               msgs_span=_messages_span(body, tb["messages"]), raw_body=body)
    return _finish(up, tb)


@dataclass(slots=True)
class Spliced:
    """A chat body whose messages start with the cached request's messages: ``rest`` is the
    body with that prefix replaced by the placeholder (small: only the new messages)."""

    body: bytes
    rest: bytes
    start: int  # offset of the messages array in body
    after: int  # offset in body of what follows the cached prefix ("," or "]")
    cache: RequestCache


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
    tb = {k: bytes(v) for k, v in top.items()}
    tb["messages"] = sp.body[sp.start:end]
    rb = [bytes(r) for r in raws[1:]]
    hashes = [raw_hash(r) for r in rb]
    hasher = sp.cache.hasher.copy()
    hasher.update(b"".join(hashes))
    up = HarnessRequest(top=tb, raws=rb, hashes=hashes, hasher=hasher, extends=True,
               base=sp.cache.node, msgs_span=RawSpan(sp.body, sp.start, end),
               raw_body=sp.body)
    return _finish(up, tb)


def up_from_dict(body: dict[str, Any], original: dict[str, Any], raw: bytes) -> HarnessRequest:
    """An :class:`HarnessRequest` for a translated request."""
    up = HarnessRequest(body=body, original=original, retry_material=raw)
    _scalars(up, body.get)
    return up


class Adapter:
    """One endpoint: parse, render a full reply, make a streamer."""

    endpoint = Endpoint.CHAT
    dialect = Dialect.OPENAI

    def __init__(self, token_fields: dict[str, Any]) -> None:
        #: Extra upstream request fields that ask for token ids and logprobs.
        self.token_fields = token_fields

    def parse(self, body: bytes, tool_args: Mapping[str, str] | None = None) -> HarnessRequest:
        """Parse (and translate) a harness request body; ``BadRequest`` if malformed.
        ``tool_args`` maps tool-call ids to the arguments text the model produced, so a
        translated dialect echoes a tool call back as that text."""
        raise NotImplementedError

    def splice(self, body: bytes, cache: RequestCache | None) -> Spliced | None:
        """The cheap known-prefix check (chat pass-through only)."""
        return None

    def parse_spliced(self, sp: Spliced) -> HarnessRequest | None:
        """Parse a body :meth:`splice` accepted (None: parse it in full instead)."""
        return None

    def reply(self, up: HarnessRequest, d: dict[str, Any], out: Outcome,
              raw: bytes | None) -> bytes:
        """The non-streamed answer body for the harness."""
        raise NotImplementedError

    def streamer(self, up: HarnessRequest) -> Streamer:
        """A streamer for one streamed answer."""
        raise NotImplementedError


class ChatAdapter(ChatReplies, Adapter):
    """OpenAI chat completions: passed through, token fields stripped when not asked for."""

    endpoint = Endpoint.CHAT
    dialect = Dialect.OPENAI

    def parse(self, body: bytes, tool_args: Mapping[str, str] | None = None) -> HarnessRequest:
        return parse_chat_bytes(body)  # passed through: the harness's own text is sent

    def splice(self, body: bytes, cache: RequestCache | None) -> Spliced | None:
        return splice_chat(body, cache)

    def parse_spliced(self, sp: Spliced) -> HarnessRequest | None:
        return parse_spliced(sp)
