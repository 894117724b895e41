"""An in-process upstream for unit tests: a handler answers each call, no sockets."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from .._errors import UpstreamError
from ._upstream_api import StreamChunk, Upstream, UpstreamReply, UpstreamRequest

__all__ = ["MockCall", "MockResponse", "MockUpstream"]


@dataclass(slots=True)
class MockCall:
    """What the handler is given: the endpoint path (``/chat/completions``, ``/models``,
    ``/tokenize``) and the decoded JSON body the proxy sent."""

    path: str
    body: dict[str, Any] = field(default_factory=dict)

    @property
    def stream(self) -> bool:
        """Whether the proxy asked for a streamed answer."""
        return bool(self.body.get("stream"))


#: A handler's answer: a JSON dict (status 200), ``(status, dict)``, or for a streamed
#: call a list of chunk dicts (a plain completion dict is streamed as one chunk).
MockResponse = dict[str, Any] | tuple[int, dict[str, Any]] | list[dict[str, Any]]
Handler = Callable[[MockCall], "MockResponse | Awaitable[MockResponse]"]


def _as_chunks(d: dict[str, Any]) -> list[dict[str, Any]]:
    """A chat completion as the one chunk that carries all of it."""
    chunk = {k: v for k, v in d.items() if k != "choices"}
    chunk["object"] = "chat.completion.chunk"
    choices = []
    for i, ch in enumerate(d.get("choices") or ()):
        c = dict(ch)
        msg = c.pop("message", None) or {}
        delta = dict(msg)
        for j, tc in enumerate(delta.get("tool_calls") or ()):
            delta["tool_calls"][j] = {"index": j, **tc}
        c["delta"] = delta
        c.setdefault("index", i)
        choices.append(c)
    chunk["choices"] = choices
    return [chunk]


class MockUpstream(Upstream):
    """An :class:`Upstream` whose every call is answered by ``handler(MockCall)`` (sync or
    async), in the spirit of httpx's ``MockTransport``. ``calls`` keeps what was asked.
    A status >= 400 raises ``UpstreamError`` as :class:`HttpUpstream` would."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.calls: list[MockCall] = []

    async def _ask(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        call = MockCall(path, body)
        self.calls.append(call)
        res = self.handler(call)
        if inspect.isawaitable(res):
            res = await res
        status: int = 200
        data: Any = res
        if isinstance(res, tuple):
            status, data = res
        if status >= 400:
            err = data.get("error") if isinstance(data, dict) else None
            msg = err.get("message") if isinstance(err, dict) else None
            raise UpstreamError(str(msg or f"upstream error {status}"),
                                status if status < 500 else 502)
        return status, data

    async def chat(self, request: UpstreamRequest) -> UpstreamReply:
        _, d = await self._ask("/chat/completions", request.body())
        if not isinstance(d, dict) or not isinstance(d.get("choices"), list):
            raise UpstreamError("upstream answered something unusable: no choices")
        return UpstreamReply(d, orjson.dumps(d), None)

    async def stream_chat(self, request: UpstreamRequest) -> AsyncIterator[StreamChunk]:
        _, d = await self._ask("/chat/completions", request.body())
        chunks = _as_chunks(d) if isinstance(d, dict) else list(d)
        for c in chunks:
            yield StreamChunk(b"data: " + orjson.dumps(c), c, None)

    async def models(self) -> bytes:
        _, d = await self._ask("/models", {})
        return orjson.dumps(d)

    async def count_tokens(self, body: dict[str, Any]) -> int:
        _, d = await self._ask("/tokenize", body)
        return int(d.get("count", 0)) if isinstance(d, dict) else 0
