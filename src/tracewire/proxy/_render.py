"""The render step of an OpenAI chat turn: the harness's answer from the upstream's (the
upstream's own body, less the token fields the proxy added), whole or streamed. The
translated dialects render in their own modules (``_anthropic_render``,
``_responses_render``)."""

from __future__ import annotations

from typing import Any

from ._adapter import Streamer
from ._http import sse
from ._rawjson import RawSpan, render
from ._request import HarnessRequest
from ._turn_types import Outcome

__all__ = ["ChatReplies", "strip_added"]


def strip_added(d: dict[str, Any], *, ids: bool, logprobs: bool) -> None:
    """Remove the token fields the proxy asked for but the harness did not (in place):
    id fields are dropped (servers omit them or send null when not asked, which SDKs read
    alike), ``logprobs`` becomes null as every server reports it when not asked."""
    if ids:
        d.pop("prompt_token_ids", None)
        d.pop("input_ids", None)
    for ch in d.get("choices") or ():
        if not isinstance(ch, dict):
            continue
        if ids:
            ch.pop("token_ids", None)
        if logprobs and "logprobs" in ch:
            ch["logprobs"] = None


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


class ChatReplies:
    """The answer side of the OpenAI chat adapter (mixed into ``ChatAdapter``): the
    upstream's reply relayed, token fields stripped when the harness did not ask for them."""

    #: Extra upstream request fields that ask for token ids and logprobs.
    token_fields: dict[str, Any]

    def reply(self, up: HarnessRequest, d: dict[str, Any], out: Outcome,
              raw: bytes | None) -> bytes:
        """The upstream's body as it came when nothing needs stripping, else re-rendered
        without the added token fields."""
        strip_ids = not up.want_ids and "return_token_ids" in self.token_fields
        strip_lp = not up.want_logprobs and "logprobs" in self.token_fields
        if not (strip_ids or strip_lp) and raw is not None:
            return raw
        strip_added(d, ids=strip_ids, logprobs=strip_lp)
        return render(d, out.span)

    def streamer(self, up: HarnessRequest) -> Streamer:
        """A streamer relaying the upstream's chunks less what the proxy added."""
        return _ChatStreamer(up, self.token_fields)
