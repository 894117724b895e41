"""What every dialect implements for the turn pipeline: :class:`Adapter` (parse a body, render
the answer, make a streamer) and :class:`Streamer`, plus the request fields every dialect
reads alike. It sits below the steps: each dialect's parse module and render module use it,
so neither has to call into another dialect's step modules (``_dialect``, ``_render``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..trace import Endpoint
from ._http import Dialect
from ._rawjson import RawSpan
from ._request import HarnessRequest
from ._turn_types import Outcome, RequestCache
from ._validate import check_depth, fail, type_name

__all__ = ["SAMPLING_KEYS", "Adapter", "Spliced", "Streamer", "read_scalars", "read_values",
           "up_from_dict"]

SAMPLING_KEYS = (
    "temperature", "top_p", "top_k", "min_p", "max_tokens", "max_completion_tokens", "n",
    "seed", "stop", "presence_penalty", "frequency_penalty", "repetition_penalty",
    "logprobs", "top_logprobs", "tool_choice",
)
_SAMPLING = frozenset(SAMPLING_KEYS)


def read_scalars(up: HarnessRequest, get: Callable[[str], Any], *,
                 sampling: bool = True) -> None:
    """Fill ``up``'s stream flag, model and (unless ``sampling`` is false: the request has
    none) sampling fields from the upstream-form request whose top-level values ``get``
    returns (None when absent)."""
    up.stream = bool(get("stream"))
    model = get("model")
    if model is not None and not isinstance(model, str):
        fail("model", f"must be a string, got {type_name(model)}")
    up.model = model or ""
    if not sampling:
        return
    up.sampling = {k: v for k in SAMPLING_KEYS if (v := get(k)) is not None}
    for k, v in up.sampling.items():  # recorded on the Call
        check_depth(v, k)


def read_values(up: HarnessRequest, vals: dict[str, Any]) -> None:
    """:func:`read_scalars` from the decoded top-level values ``vals`` (what a chat body
    holds): the sampling fields are looked for only when the body has one."""
    read_scalars(up, vals.get, sampling=not _SAMPLING.isdisjoint(vals))


def up_from_dict(body: dict[str, Any], original: dict[str, Any], raw: bytes) -> HarnessRequest:
    """An :class:`HarnessRequest` for a translated request: ``body`` in chat form, made
    from the harness's ``original`` request, whose bytes ``raw`` identify SDK retries."""
    up = HarnessRequest(body=body, original=original, retry_material=raw)
    read_scalars(up, body.get)
    return up


@dataclass(slots=True)
class Spliced:
    """A chat body whose messages start with the cached request's messages: ``rest`` is the
    body with that prefix replaced by the placeholder (small: only the new messages)."""

    body: bytes
    rest: bytes
    start: int  # offset of the messages array in body
    after: int  # offset in body of what follows the cached prefix ("," or "]")
    cache: RequestCache


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
    """One endpoint: parse, render a full reply, make a streamer. A dialect's adapter is
    its parse side with its render side mixed in, so the pipeline's parse step runs in the
    parse module and its render step in the render module."""

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
