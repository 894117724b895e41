"""The OpenAI-compatible pass-through upstream: chat completions over the proxy's own
HTTP/1.1 client (``_http_client``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
from yarl import URL

from .._errors import UpstreamError
from ._http_client import HttpClient
from ._prompt_cut import cut_ok, cut_prompt, loads_split
from ._upstream_api import StreamChunk, Upstream, UpstreamReply, UpstreamRequest

__all__ = ["HttpUpstream", "upstream_message"]


def upstream_message(data: bytes, status: int) -> str:
    """The upstream's own error message when it gave one."""
    try:
        d = orjson.loads(data)
    except orjson.JSONDecodeError:
        text = data[:2000].decode("utf-8", "replace").strip()
        return f"upstream error {status}: {text}"
    if isinstance(d, dict):
        err = d.get("error", d)
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return str(err["message"])
        if isinstance(err, str):
            return err
        if isinstance(d.get("message"), str):
            return str(d["message"])
    return f"upstream error {status}"


def _refused(data: bytes, status: int) -> UpstreamError:
    return UpstreamError(upstream_message(data, status), status if status < 500 else 502)


async def _lines(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """SSE lines of any length (vLLM's first chunk can carry a long prompt_token_ids list)."""
    buf = b""
    async for data in chunks:
        buf += data
        if b"\n" in data:
            *lines, buf = buf.split(b"\n")
            for line in lines:
                yield line.rstrip(b"\r")
    if buf:
        yield buf


class HttpUpstream(Upstream):
    """An OpenAI-compatible server at ``base_url`` (e.g. ``http://127.0.0.1:8000/v1``),
    called over pooled keep-alive connections; ``api_key`` is sent as a bearer token."""

    def __init__(self, base_url: str, *, api_key: str | None = None, timeout: float = 600.0,
                 connections: int = 1024, thread_threshold_bytes: int = 256 * 1024) -> None:
        self.base_url = base_url.rstrip("/")
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.timeout = timeout
        self.connections = connections
        self.thread_threshold_bytes = thread_threshold_bytes
        #: The base URL's path, which every call's path extends (e.g. ``/v1``).
        self.path = URL(self.base_url).raw_path.rstrip("/")
        self._client: HttpClient | None = None

    def __repr__(self) -> str:
        return f"HttpUpstream({self.base_url!r})"

    async def start(self) -> None:
        if self._client is None:
            # Headers (content type, bearer token) are written once into every call's
            # head; inference servers set no cookies and follow no redirects.
            self._client = HttpClient(self.base_url, headers=self.headers,
                                      timeout=self.timeout, connections=self.connections)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    @property
    def client(self) -> HttpClient:
        """The pooled client (``UpstreamError`` before :meth:`start`)."""
        if self._client is None:
            raise UpstreamError("upstream not started")
        return self._client

    async def chat(self, request: UpstreamRequest) -> UpstreamReply:
        answer = await self.client.request("POST", self.path + "/chat/completions",
                                           request.payload)
        if answer.status >= 400:
            raise _refused(answer.body, answer.status)
        try:
            return await self._parse(answer.body, request.split)
        except (ValueError, TypeError) as exc:
            raise UpstreamError(f"upstream answered something unusable: {exc}") from exc

    async def _parse(self, data: bytes, split: bool) -> UpstreamReply:
        # The prompt ids array (100k ints late in a session) is cut out unparsed when the
        # caller can take it that way (see ``_rawjson``/``_prompt``).
        if split:
            cut = cut_prompt(data)
            if cut is not None:
                rest, span, name = cut
                try:
                    d = orjson.loads(rest) if len(rest) <= self.thread_threshold_bytes \
                        else await self.offload(len(rest), orjson.loads, rest)
                except orjson.JSONDecodeError:
                    d = None
                if cut_ok(d, name):
                    return UpstreamReply(_completion(d), data, span)
        d = await self.offload(len(data), orjson.loads, data)
        return UpstreamReply(_completion(d), data, None)

    async def stream_chat(self, request: UpstreamRequest) -> AsyncIterator[StreamChunk]:
        async with self.client.stream("POST", self.path + "/chat/completions",
                                      request.payload) as s:
            if s.status >= 400:
                raise _refused(await s.read(), s.status)
            async for line in _lines(s.chunks()):
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    return
                try:
                    d, span = loads_split(data)
                except ValueError as exc:
                    raise UpstreamError(f"upstream sent a malformed chunk: {exc}") from exc
                if "error" in d and not d.get("choices"):
                    raise UpstreamError(upstream_message(data, 502))
                yield StreamChunk(line, d, span)

    async def models(self) -> bytes:
        answer = await self.client.request("GET", self.path + "/models")
        if answer.status >= 400:
            raise UpstreamError(upstream_message(answer.body, answer.status))
        return answer.body

    async def count_tokens(self, body: dict[str, Any]) -> int:
        # vLLM's /tokenize when the server has one, else a one-token generation's usage.
        root = self.path[:-3] if self.path.endswith("/v1") else self.path
        req = {"model": body.get("model", ""), "messages": body.get("messages", []),
               "add_generation_prompt": True}
        if body.get("tools"):
            req["tools"] = body["tools"]
        try:
            answer = await self.client.request("POST", root + "/tokenize", orjson.dumps(req))
            if answer.status == 200:
                d = orjson.loads(answer.body)
                if isinstance(d, dict) and isinstance(d.get("count"), int):
                    return int(d["count"])
            probe = {**{k: v for k, v in body.items() if k != "stream"}, "max_tokens": 1}
            answer = await self.client.request("POST", self.path + "/chat/completions",
                                               orjson.dumps(probe))
            if answer.status == 200:
                d = orjson.loads(answer.body)
                if isinstance(d, dict) and isinstance(d.get("usage"), dict):
                    return int(d["usage"].get("prompt_tokens", 0))
            raise UpstreamError(f"upstream cannot count tokens (status {answer.status})")
        except (ValueError, TypeError) as exc:
            raise UpstreamError(f"upstream cannot count tokens: {exc}") from exc


def _completion(d: Any) -> dict[str, Any]:
    if not isinstance(d, dict) or not isinstance(d.get("choices"), list):
        raise ValueError("no choices")
    return d
