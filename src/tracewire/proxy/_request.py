"""The harness request in upstream (chat completions) form: what the parse step makes of a
body and every later step of the turn reads (matching its messages, the payload sent
upstream, the flags the answer is rendered with)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec
import orjson

from ..trace import message_digest
from ._http import BadRequest
from ._rawjson import RawSpan, skip_ws_back
from ._turn_types import NewMessage
from ._validate import checked_message, fail, load_json, type_name

__all__ = ["HarnessRequest"]

_decode_list = msgspec.json.Decoder(list[msgspec.Raw]).decode
_CLOSE_BRACE = 0x7D


@dataclass(slots=True)
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
    #: Chat pass-through: top-level raw JSON values (a spliced body's ``messages`` is a view
    #: into ``raw_body``) and the raw bytes per message (the graph's fast-path keys).
    top: dict[str, bytes | memoryview] | None = None
    raws: list[bytes] | None = None
    #: Translated dialects (or hooks): the full chat request as a dict.
    body: dict[str, Any] | None = None
    #: Bytes identifying the request for SDK retries.
    retry_material: bytes = b""
    #: The original request (translated dialects need it to render answers).
    original: dict[str, Any] | None = None
    #: Chat pass-through that extends the session's last request byte for byte: ``raws``
    #: holds only the messages after that prefix, whose path ends at ``base``.
    extends: bool = False
    base: int | None = None
    #: Where the messages array lies in the body, and a blake2b state over every message's
    #: raw bytes (what the session caches for the next request).
    msgs_span: RawSpan | None = None
    hasher: Any = None
    #: Chat pass-through: the harness's body as received (a JSON object).
    raw_body: bytes | None = None

    def forget_raw(self, body: dict[str, Any]) -> None:
        """Switch to dict form (a request hook rewrote the body): no raw fast paths."""
        self.body, self.top, self.raws = body, None, None
        self.raw_body = None
        self.extends, self.base, self.msgs_span, self.hasher = False, None, None, None

    def as_dict(self) -> dict[str, Any]:
        """The chat request as a dict (decodes the pass-through form once)."""
        if self.body is None:
            assert self.top is not None
            self.body = {k: load_json(v, k) for k, v in self.top.items()}
        return self.body

    def payload(self, token_fields: dict[str, Any]) -> bytes:
        """The JSON body sent upstream: :meth:`upstream_bytes`, and a stream asks for its
        usage chunk (so ``Call.usage`` is filled; the chat streamer hides the chunk from a
        harness that did not ask for it), kept with the harness's other stream options."""
        if self.stream and not self.want_usage:
            token_fields = self._with_usage(token_fields)
        return self.upstream_bytes(token_fields)

    def _with_usage(self, fields: dict[str, Any]) -> dict[str, Any]:
        # Dict form: set in the body itself.
        if self.body is not None:
            opts = self.body.get("stream_options")
            self.body["stream_options"] = {**(opts if isinstance(opts, dict) else {}),
                                           "include_usage": True}
            return fields
        assert self.top is not None
        opts = load_json(self.top["stream_options"], "stream_options") \
            if "stream_options" in self.top else None
        return {**fields, "stream_options": {**(opts if isinstance(opts, dict) else {}),
                                             "include_usage": True}}

    def upstream_bytes(self, token_fields: dict[str, Any]) -> bytes:
        """The JSON body sent upstream, with the token fields added."""
        if self.body is not None:
            try:
                return orjson.dumps({**self.body, **token_fields})
            except TypeError as exc:  # nested past what orjson writes (a hook's body)
                raise BadRequest(400, f"the request cannot be forwarded: {exc}") from exc
        assert self.top is not None
        raw = self.raw_body
        if raw is not None and self.top.keys().isdisjoint(token_fields):
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
                out.append(NewMessage(msg, message_digest(msg), raw))
            return out
        return self.new_messages(0)

    def new_messages(self, start: int) -> list[NewMessage]:
        """Messages ``start..`` of ``raws`` (or of the dict form) decoded, canonically
        digested (with their raw bytes if any)."""
        if self.raws is not None:
            # After a spliced prefix the index counts from the first new message.
            at = "messages[+{}]" if self.extends else "messages[{}]"
            out = []
            for i, raw in enumerate(self.raws[start:], start):
                msg = checked_message(raw, at.format(i))
                out.append(NewMessage(msg, message_digest(msg), raw))
            return out
        msgs = self.as_dict().get("messages") or []
        if not isinstance(msgs, list):
            fail("messages", f"must be an array, got {type_name(msgs)}")
        out = []
        for i, d in enumerate(msgs[start:], start):
            msg = checked_message(d, f"messages[{i}]")
            out.append(NewMessage(msg, message_digest(msg), None))
        return out
