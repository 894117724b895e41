"""The proxy's upstream seam: what the turn pipeline asks of the model server behind it.

The proxy speaks OpenAI chat completions to its upstream, with vLLM's token fields: the
request is a chat-completions JSON body (``messages``, ``tools``, sampling keys, plus the
configured token fields such as ``return_token_ids``/``logprobs``), and the answer is a chat
completion (or its ``chat.completion.chunk`` stream) whose token ids sit where vLLM puts
them: ``prompt_token_ids`` at the top level, ``choices[i].token_ids`` and
``choices[i].logprobs.content[j].logprob``. An :class:`Upstream` owns everything about
reaching such a server (client session, base URL, headers, error parsing, offloading big
bodies to a thread); :class:`~tracewire.proxy.Proxy` takes one or a URL string (which
becomes an :class:`~tracewire.proxy.HttpUpstream`). An implementation that is not an HTTP
pass-through (token-in/token-out over an engine, a mock) answers in the same shape.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import orjson
from numpy.typing import NDArray

from ..trace import Trace
from ._offload import offload
from ._rawjson import RawSpan

__all__ = ["StreamChunk", "TurnContext", "Upstream", "UpstreamReply", "UpstreamRequest"]

T = TypeVar("T")


@dataclass(slots=True, frozen=True)
class TurnContext:
    """What the turn pipeline matched for a request, for upstreams that build the prompt
    themselves (token-in/token-out); only filled when :attr:`Upstream.wants_context`.

    ``base_ids`` are the recorded ids of the path the request's history extends (its
    deepest matched node), None when nothing matched or that path lacks tokens;
    ``base_sampled`` says that node is a sampled completion (the echoed assistant message),
    ``base_ended_by_stop`` false when that completion was cut by length; the last
    ``new_messages`` messages of the request match no recorded node. ``recorded`` says the
    session has recorded messages before, ``root_role`` the role of its first one.
    """

    session_id: str
    new_messages: int
    base_ids: Sequence[int] | NDArray[np.int32] | None = None
    base_sampled: bool = False
    base_ended_by_stop: bool = True
    recorded: bool = False
    root_role: str | None = None


@dataclass(slots=True)
class UpstreamRequest:
    """One chat-completions call the proxy makes for a harness turn.

    ``payload`` is the exact JSON body an OpenAI-compatible server gets (token fields
    included; ``stream`` inside it matches :attr:`stream`). ``split`` says the caller can
    take the prompt ids unparsed (no response hook needs the whole dict): an implementation
    may then answer with :attr:`UpstreamReply.span` set.
    """

    payload: bytes
    stream: bool = False
    split: bool = True
    #: The matched history (see :class:`TurnContext`); None unless the upstream wants it.
    context: TurnContext | None = None
    #: Facts the upstream reports about this call (e.g. ``"malformed_tool_call"``); the
    #: pipeline records them on the committed :class:`~tracewire.trace.Call` ``flags``.
    flags: list[str] = field(default_factory=list)
    #: Whether the harness itself asked for per-token logprobs in its answer. An
    #: implementation that builds its answer may then leave ``logprobs.content`` out and
    #: hand the logprobs over as :attr:`UpstreamReply.logprobs` (a dict per token is most
    #: of the cost of a long answer).
    want_logprobs: bool = True

    def body(self) -> dict[str, Any]:
        """The payload decoded (for implementations that do not forward bytes)."""
        d = orjson.loads(self.payload)
        if not isinstance(d, dict):
            raise ValueError("upstream payload is not a JSON object")
        return d


@dataclass(slots=True)
class UpstreamReply:
    """A non-streamed answer: a chat-completion dict in vLLM's token-field shape.

    ``raw`` is the body exactly as received when ``data`` was parsed from it (the chat
    pass-through may relay it unchanged); None when the implementation built ``data``
    itself. ``span`` is set only when the request allowed ``split``: then the prompt ids
    field of ``data`` holds :data:`tracewire.proxy._rawjson.SENTINEL` and ``span`` is
    where the ids array lies inside ``raw`` (the pipeline reads it lazily).
    """

    data: dict[str, Any]
    raw: bytes | None = None
    span: RawSpan | None = None
    #: The sampled tokens' logprobs of choice 0 when ``data`` leaves ``logprobs.content``
    #: out (see :attr:`UpstreamRequest.want_logprobs`); the pipeline records these.
    logprobs: list[float] | None = None


@dataclass(slots=True)
class StreamChunk:
    """One ``chat.completion.chunk`` of a streamed answer.

    ``line`` is the SSE ``data:`` line as received (``b"data: {...}"``, no line end; an
    implementation that builds chunks renders one), ``data`` is its JSON object, and
    ``span`` is set as in :class:`UpstreamReply` when the chunk carries the prompt ids
    unparsed. The terminal ``[DONE]`` is not a chunk: the iterator just ends.
    """

    line: bytes
    data: dict[str, Any]
    span: RawSpan | None = None


class Upstream(ABC):
    """The model server behind the proxy. Failures raise
    :class:`~tracewire.UpstreamError` with ``status`` (the upstream's HTTP status for a
    4xx it gave, else 502) and a message fit for the harness (the upstream's own message
    when it gave one)."""

    #: Reply bodies above this size are parsed in a worker thread (see :meth:`offload`);
    #: the proxy's own requests follow ``ProxyConfig.thread_threshold_bytes``.
    thread_threshold_bytes: int = 256 * 1024
    #: Whether requests carry a :class:`TurnContext` (costs a copy of the matched ids).
    wants_context: bool = False

    async def start(self) -> None:  # noqa: B027 - optional hook, default does nothing
        """Open connections (called once by ``Proxy.start``)."""

    async def close(self) -> None:  # noqa: B027 - optional hook, default does nothing
        """Release connections (called once by ``Proxy.stop``)."""

    @abstractmethod
    async def chat(self, request: UpstreamRequest) -> UpstreamReply:
        """Make one non-streamed call; returns the whole answer (``data`` must hold a
        ``choices`` list) or raises ``UpstreamError``."""

    @abstractmethod
    def stream_chat(self, request: UpstreamRequest) -> AsyncIterator[StreamChunk]:
        """Make one streamed call: an async iterator of its chunks, in order, ending after
        the last one (the ``[DONE]`` marker is consumed, not yielded). Raises
        ``UpstreamError`` from the first ``__anext__`` when the call is refused, and from a
        later one when the stream breaks (an in-stream ``error`` object, malformed JSON, a
        dropped connection). The caller may stop iterating early; implementations release
        the call when the iterator is closed (``aclose``) or garbage collected."""

    @abstractmethod
    async def models(self) -> bytes:
        """The upstream's ``GET /models`` answer, as the JSON bytes to relay."""

    @abstractmethod
    async def count_tokens(self, body: dict[str, Any]) -> int:
        """Prompt tokens of a chat-completions request dict (``messages``, ``tools``,
        ``model``), as the upstream's chat template renders them."""

    async def session_report(self, session_id: str, trace: Trace) -> dict[str, Any] | None:
        """Facts about a finished session to record in its trace's ``info`` (the
        token-in/token-out mismatch report); None by default. Called off the hot path."""
        return None

    async def offload(self, size: int, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``, in a worker thread when ``size`` (bytes) is over
        :attr:`thread_threshold_bytes`, so big bodies never stall the event loop."""
        return await offload(size, self.thread_threshold_bytes, fn, *args)
