"""Endpoint adapters: parse a harness request into an upstream chat-completions request and
render upstream answers back (OpenAI chat is a pass-through; see ``_anthropic`` and
``_responses`` for the translated dialects)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec
import orjson

from ._graph import NewMessage, Outcome, canonical_digest, chat_message, raw_hash
from ._http import BadRequest, sse
from ._upstream import strip_added

__all__ = ["SAMPLING_KEYS", "Adapter", "ChatAdapter", "Streamer", "UpReq"]

SAMPLING_KEYS = (
    "temperature", "top_p", "top_k", "min_p", "max_tokens", "max_completion_tokens", "n",
    "seed", "stop", "presence_penalty", "frequency_penalty", "repetition_penalty",
    "logprobs", "top_logprobs", "tool_choice",
)
_Top = dict[str, msgspec.Raw]


@dataclass
class UpReq:
    """A harness request in upstream (chat completions) form, plus what matching needs."""

    stream: bool = False
    model: str = ""
    sampling: dict[str, Any] = field(default_factory=dict)
    want_ids: bool = False
    want_logprobs: bool = False
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

    def as_dict(self) -> dict[str, Any]:
        """The chat request as a dict (decodes the pass-through form once)."""
        if self.body is None:
            assert self.top is not None
            self.body = {k: orjson.loads(v) for k, v in self.top.items()}
        return self.body

    def upstream_bytes(self, token_fields: dict[str, Any]) -> bytes:
        """The JSON body sent upstream, with the token fields added."""
        if self.body is not None:
            return orjson.dumps({**self.body, **token_fields})
        assert self.top is not None
        top = dict(self.top)
        for k, v in token_fields.items():
            top[k] = orjson.dumps(v)
        return b"{" + b",".join(orjson.dumps(k) + b":" + v for k, v in top.items()) + b"}"

    def new_messages(self, start: int) -> list[NewMessage]:
        """Messages ``start..`` decoded, canonically digested (with raw hashes if any)."""
        if self.raws is not None:
            assert self.hashes is not None
            out = []
            for raw, h in zip(self.raws[start:], self.hashes[start:], strict=True):
                msg = chat_message(orjson.loads(raw))
                out.append(NewMessage(msg, canonical_digest(msg), h))
            return out
        msgs = self.as_dict().get("messages") or []
        out = []
        for d in msgs[start:]:
            msg = chat_message(d)
            out.append(NewMessage(msg, canonical_digest(msg), None))
        return out


def _scalars(up: UpReq, get: Any) -> None:
    up.stream = bool(get("stream"))
    model = get("model")
    up.model = model if isinstance(model, str) else ""
    up.sampling = {k: v for k in SAMPLING_KEYS if (v := get(k)) is not None}


def parse_chat_bytes(body: bytes) -> UpReq:
    """Split a chat-completions body without decoding the messages (the fast path)."""
    try:
        top = msgspec.json.decode(body, type=_Top)
        if "messages" not in top:
            raise BadRequest(400, "'messages' is required")
        raws = msgspec.json.decode(top["messages"], type=list[msgspec.Raw])
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise BadRequest(400, f"malformed JSON body: {exc}") from exc
    tb = {k: bytes(v) for k, v in top.items()}
    rb = [bytes(r) for r in raws]
    hashes = [raw_hash(r) for r in rb]
    up = UpReq(top=tb, raws=rb, hashes=hashes)

    def get(k: str) -> Any:
        v = tb.get(k)
        return None if v is None else orjson.loads(v)

    _scalars(up, get)
    up.want_ids = bool(get("return_token_ids"))
    up.want_logprobs = bool(get("logprobs"))
    rest = b"".join(v for k, v in sorted(tb.items()) if k != "messages")
    up.retry_material = b"".join(hashes) + rest
    return up


def up_from_dict(body: dict[str, Any], original: dict[str, Any], raw: bytes) -> UpReq:
    """An :class:`UpReq` for a translated request."""
    up = UpReq(body=body, original=original, retry_material=raw)
    _scalars(up, body.get)
    return up


class Streamer:
    """Turns upstream chat chunks into the harness's stream format."""

    dialect = "openai"
    keepalive = b": keepalive\n\n"

    def start(self) -> bytes:
        """Bytes opening the stream (written once the response is prepared)."""
        return b""

    def chunk(self, line: bytes, d: dict[str, Any]) -> bytes:
        """Bytes to relay for one upstream data line (parsed as ``d``)."""
        raise NotImplementedError

    def done(self, out: Outcome) -> bytes:
        """Bytes closing the stream after the turn committed."""
        raise NotImplementedError


class Adapter:
    """One endpoint: parse, render a full reply, make a streamer."""

    endpoint = "chat"
    dialect = "openai"

    def parse(self, body: bytes) -> UpReq:
        """Parse (and translate) a harness request body; ``BadRequest`` if malformed."""
        raise NotImplementedError

    def reply(self, up: UpReq, d: dict[str, Any], out: Outcome, raw: bytes | None) -> bytes:
        """The non-streamed answer body for the harness."""
        raise NotImplementedError

    def streamer(self, up: UpReq) -> Streamer:
        """A streamer for one streamed answer."""
        raise NotImplementedError


class _ChatStreamer(Streamer):
    def __init__(self, up: UpReq, token_fields: dict[str, Any]) -> None:
        self.strip_ids = not up.want_ids and "return_token_ids" in token_fields
        self.strip_lp = not up.want_logprobs and "logprobs" in token_fields

    def chunk(self, line: bytes, d: dict[str, Any]) -> bytes:
        if self.strip_ids or self.strip_lp:
            strip_added(d, ids=self.strip_ids, logprobs=self.strip_lp)
            return sse(d)
        return line + b"\n\n"

    def done(self, out: Outcome) -> bytes:
        return b"data: [DONE]\n\n"


class ChatAdapter(Adapter):
    """OpenAI chat completions: passed through, token fields stripped when not asked for."""

    endpoint = "chat"
    dialect = "openai"

    def __init__(self, token_fields: dict[str, Any]) -> None:
        self.token_fields = token_fields

    def parse(self, body: bytes) -> UpReq:
        return parse_chat_bytes(body)

    def reply(self, up: UpReq, d: dict[str, Any], out: Outcome, raw: bytes | None) -> bytes:
        strip_ids = not up.want_ids and "return_token_ids" in self.token_fields
        strip_lp = not up.want_logprobs and "logprobs" in self.token_fields
        if not (strip_ids or strip_lp) and raw is not None:
            return raw
        strip_added(d, ids=strip_ids, logprobs=strip_lp)
        return orjson.dumps(d)

    def streamer(self, up: UpReq) -> Streamer:
        return _ChatStreamer(up, self.token_fields)
