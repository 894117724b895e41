"""Endpoint adapters: parse a harness request into an upstream chat-completions request and
render upstream answers back (OpenAI chat is a pass-through; see ``_anthropic`` and
``_responses`` for the translated dialects)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec
import orjson

from ..trace import Endpoint, message_digest
from ._graph import NewMessage, Outcome, RequestCache, raw_hash
from ._http import BadRequest, Dialect, sse
from ._rawjson import SENTINEL_JSON, RawSpan, find_value, render, skip_ws, skip_ws_back
from ._upstream import strip_added
from ._validate import check_depth, checked_message, fail, load_json, type_name

__all__ = ["SAMPLING_KEYS", "Adapter", "ChatAdapter", "HarnessRequest", "Spliced", "Streamer"]

SAMPLING_KEYS = (
    "temperature", "top_p", "top_k", "min_p", "max_tokens", "max_completion_tokens", "n",
    "seed", "stop", "presence_penalty", "frequency_penalty", "repetition_penalty",
    "logprobs", "top_logprobs", "tool_choice",
)
_Top = dict[str, msgspec.Raw]
_decode_top = msgspec.json.Decoder(_Top).decode
_decode_list = msgspec.json.Decoder(list[msgspec.Raw]).decode
_CLOSE = 0x5D
_CLOSE_BRACE = 0x7D


@dataclass
class HarnessRequest:
    """A harness request in upstream (chat completions) form, plus what matching needs."""

    stream: bool = False
    model: str = ""
    sampling: dict[str, Any] = field(default_factory=dict)
    want_ids: bool = False
    want_logprobs: bool = False
    #: The harness asked for the usage chunk of a stream (``stream_options.include_usage``).
    want_usage: bool = False
    #: Names of the harness's tools the upstream request could not carry (hosted tools).
    unforwarded: list[str] = field(default_factory=list)
    #: Chat pass-through: top-level raw JSON values and the raw bytes / hashes per message.
    top: dict[str, bytes] | None = None
    raws: list[bytes] | None = None
    hashes: list[bytes] | None = None
    #: Translated dialects (or hooks): the full chat request as a dict.
    body: dict[str, Any] | None = None
    #: Bytes identifying the request for SDK retries.
    retry_material: bytes = b""
    #: The original request (translated dialects need it to render answers).
    original: dict[str, Any] | None = None
    #: Chat pass-through that extends the session's last request byte for byte: ``raws``
    #: and ``hashes`` hold only the messages after that prefix, whose path ends at ``base``.
    extends: bool = False
    base: int | None = None
    #: Where the messages array lies in the body, and a blake2b state over every message's
    #: raw hash (what the session caches for the next request).
    msgs_span: RawSpan | None = None
    hasher: Any = None
    #: Chat pass-through: the harness's body as received (a JSON object).
    raw_body: bytes | None = None

    def forget_raw(self, body: dict[str, Any]) -> None:
        """Switch to dict form (a request hook rewrote the body): no raw fast paths."""
        self.body, self.top, self.raws, self.hashes = body, None, None, None
        self.raw_body = None
        self.extends, self.base, self.msgs_span, self.hasher = False, None, None, None

    def as_dict(self) -> dict[str, Any]:
        """The chat request as a dict (decodes the pass-through form once)."""
        if self.body is None:
            assert self.top is not None
            self.body = {k: load_json(v, k) for k, v in self.top.items()}
        return self.body

    def upstream_bytes(self, token_fields: dict[str, Any]) -> bytes:
        """The JSON body sent upstream, with the token fields added."""
        if self.body is not None:
            try:
                return orjson.dumps({**self.body, **token_fields})
            except TypeError as exc:  # nested past what orjson writes (a hook's body)
                raise BadRequest(400, f"the request cannot be forwarded: {exc}") from exc
        assert self.top is not None
        raw = self.raw_body
        if raw is not None and not any(k in self.top for k in token_fields):
            # The harness's bytes with the fields inserted before the closing brace: one
            # copy of a body that is hundreds of KB late in a long session.
            end = skip_ws_back(raw, len(raw))
            if end and raw[end - 1] == _CLOSE_BRACE:
                if not token_fields:
                    return raw
                extra = orjson.dumps(token_fields)
                view = memoryview(raw)
                return b"".join((view[:end - 1], b",", extra[1:-1], view[end - 1:]))
        top = dict(self.top)
        for k, v in token_fields.items():
            top[k] = orjson.dumps(v)
        return b"{" + b",".join(orjson.dumps(k) + b":" + v for k, v in top.items()) + b"}"

    def all_messages(self) -> list[NewMessage]:
        """Every message of the request decoded and digested (a mismatch re-roots them all;
        ``new_messages`` may cover only the tail after a known prefix)."""
        if self.extends:
            assert self.top is not None
            raws = [bytes(r) for r in _decode_list(self.top["messages"])]
            out = []
            for i, raw in enumerate(raws):
                msg = checked_message(raw, f"messages[{i}]")
                out.append(NewMessage(msg, message_digest(msg), raw_hash(raw)))
            return out
        return self.new_messages(0)

    def new_messages(self, start: int) -> list[NewMessage]:
        """Messages ``start..`` of ``raws`` (or of the dict form) decoded, canonically
        digested (with raw hashes if any)."""
        if self.raws is not None:
            assert self.hashes is not None
            # After a spliced prefix the index counts from the first new message.
            at = "messages[+{}]" if self.extends else "messages[{}]"
            out = []
            for i, (raw, h) in enumerate(zip(self.raws[start:], self.hashes[start:],
                                             strict=True), start):
                msg = checked_message(raw, at.format(i))
                out.append(NewMessage(msg, message_digest(msg), h))
            return out
        msgs = self.as_dict().get("messages") or []
        if not isinstance(msgs, list):
            fail("messages", f"must be an array, got {type_name(msgs)}")
        out = []
        for i, d in enumerate(msgs[start:], start):
            msg = checked_message(d, f"messages[{i}]")
            out.append(NewMessage(msg, message_digest(msg), None))
        return out


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


class Streamer:
    """Turns upstream chat chunks into the harness's stream format."""

    dialect = Dialect.OPENAI
    keepalive = b": keepalive\n\n"

    def start(self) -> bytes:
        """Bytes opening the stream (written once the response is prepared)."""
        return b""

    def chunk(self, line: bytes, d: dict[str, Any], span: RawSpan | None = None) -> bytes:
        """Bytes to relay for one upstream data line (parsed as ``d``; ``span``: where its
        prompt ids lie when ``d`` holds the placeholder)."""
        raise NotImplementedError

    def done(self, out: Outcome) -> bytes:
        """Bytes closing the stream after the turn committed."""
        raise NotImplementedError


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


#: How servers write the usage marker after another member (quotes inside JSON strings
#: are escaped, so these bytes only occur as a member of an object).
_NULL_USAGE = (b',"usage":null', b', "usage": null')


def _drop_null_usage(line: bytes) -> bytes | None:
    """``line`` without its one ``"usage": null`` member, or None when it is not written in
    a form found by a byte search (the caller re-renders the chunk then)."""
    if line.count(b'"usage"') != 1:  # only the top-level member may be cut by bytes
        return None
    for pat in _NULL_USAGE:
        if pat in line:
            return line.replace(pat, b"", 1)
    return None


class _ChatStreamer(Streamer):
    def __init__(self, up: HarnessRequest, token_fields: dict[str, Any]) -> None:
        self.strip_ids = not up.want_ids and "return_token_ids" in token_fields
        self.strip_lp = not up.want_logprobs and "logprobs" in token_fields
        #: The proxy asked for usage on the harness's behalf: hide what that added.
        self.strip_usage = not up.want_usage

    def chunk(self, line: bytes, d: dict[str, Any], span: RawSpan | None = None) -> bytes:
        edit = self.strip_ids or self.strip_lp
        if self.strip_usage and "usage" in d:
            if not d.get("choices"):
                return b""  # the usage-only last chunk: recorded, not relayed
            if d["usage"] is None:  # servers mark every chunk once usage is asked for
                del d["usage"]
                if not edit:
                    cut = _drop_null_usage(line)
                    if cut is not None:
                        return cut + b"\n\n"
                edit = True
        if edit:
            strip_added(d, ids=self.strip_ids, logprobs=self.strip_lp)
            return sse(render(d, span))
        return line + b"\n\n"

    def done(self, out: Outcome) -> bytes:
        return b"data: [DONE]\n\n"


class ChatAdapter(Adapter):
    """OpenAI chat completions: passed through, token fields stripped when not asked for."""

    endpoint = Endpoint.CHAT
    dialect = Dialect.OPENAI

    def parse(self, body: bytes, tool_args: Mapping[str, str] | None = None) -> HarnessRequest:
        return parse_chat_bytes(body)  # passed through: the harness's own text is sent

    def splice(self, body: bytes, cache: RequestCache | None) -> Spliced | None:
        return splice_chat(body, cache)

    def parse_spliced(self, sp: Spliced) -> HarnessRequest | None:
        return parse_spliced(sp)

    def reply(self, up: HarnessRequest, d: dict[str, Any], out: Outcome,
              raw: bytes | None) -> bytes:
        strip_ids = not up.want_ids and "return_token_ids" in self.token_fields
        strip_lp = not up.want_logprobs and "logprobs" in self.token_fields
        if not (strip_ids or strip_lp) and raw is not None:
            return raw
        strip_added(d, ids=strip_ids, logprobs=strip_lp)
        return render(d, out.span)

    def streamer(self, up: HarnessRequest) -> Streamer:
        return _ChatStreamer(up, self.token_fields)
