"""The OpenAI-compatible pass-through upstream: chat completions over aiohttp."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson

from .._errors import UpstreamError
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


def _failed(exc: BaseException) -> UpstreamError:
    return UpstreamError(f"upstream failed: {exc or type(exc).__name__}")


# Answers up to this size are read with one wake-up at their end (``_whole``); it is also
# the read buffer of a non-streamed call, so such an answer never pauses the socket.
_WHOLE_BYTES = 8 << 20


async def _whole(r: aiohttp.ClientResponse) -> bytes:
    """The answer's body. With a Content-Length within the read buffer and no content
    coding, the task waits once for the end (``wait_eof``) and takes the buffer
    (``read_nowait``) instead of waking per chunk as ``read()`` does (~6 chunks for a 410 KB
    answer of prompt ids). Anything else goes through ``read()``."""
    n = r.content_length
    if n is None or n > _WHOLE_BYTES or r.headers.get("Content-Encoding", "identity") \
            not in ("identity", ""):
        return await r.read()
    await r.content.wait_eof()
    return r.content.read_nowait()


async def _lines(content: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    """SSE lines of any length (aiohttp's readline caps line size; vLLM's first chunk can
    carry a long prompt_token_ids list)."""
    buf = b""
    while True:
        data = await content.readany()
        if not data:
            if buf:
                yield buf
            return
        buf += data
        if b"\n" in data:
            *lines, buf = buf.split(b"\n")
            for line in lines:
                yield line.rstrip(b"\r")


class HttpUpstream(Upstream):
    """An OpenAI-compatible server at ``base_url`` (e.g. ``http://127.0.0.1:8000/v1``),
    called with one pooled aiohttp session; ``api_key`` is sent as a bearer token."""

    def __init__(self, base_url: str, *, api_key: str | None = None, timeout: float = 600.0,
                 connections: int = 1024, thread_threshold_bytes: int = 256 * 1024) -> None:
        self.base_url = base_url.rstrip("/")
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.timeout = timeout
        self.connections = connections
        self.thread_threshold_bytes = thread_threshold_bytes
        self._client: aiohttp.ClientSession | None = None

    def __repr__(self) -> str:
        return f"HttpUpstream({self.base_url!r})"

    async def start(self) -> None:
        if self._client is None:
            # No cookie jar, and the headers (content type, bearer token) set once on the
            # session for every call: each call then skips a cookie filter and a header
            # merge (~9 % of the proxy's CPU per turn at 64 sessions, bench/README.md).
            # Inference servers set no cookies.
            self._client = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.connections),
                timeout=aiohttp.ClientTimeout(total=self.timeout), auto_decompress=True,
                cookie_jar=aiohttp.DummyCookieJar(), headers=self.headers)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    @property
    def client(self) -> aiohttp.ClientSession:
        """The pooled session (``UpstreamError`` before :meth:`start`)."""
        if self._client is None:
            raise UpstreamError("upstream not started")
        return self._client

    async def chat(self, request: UpstreamRequest) -> UpstreamReply:
        try:
            async with self.client.post(self.base_url + "/chat/completions",
                                        data=request.payload,
                                        read_bufsize=_WHOLE_BYTES) as r:
                data = await _whole(r)
                status = r.status
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise _failed(exc) from exc
        if status >= 400:
            raise _refused(data, status)
        try:
            return await self._parse(data, request.split)
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
        try:
            async with self.client.post(self.base_url + "/chat/completions",
                                        data=request.payload) as r:
                if r.status >= 400:
                    raise _refused(await r.read(), r.status)
                async for line in _lines(r.content):
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
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise _failed(exc) from exc

    async def models(self) -> bytes:
        try:
            async with self.client.get(self.base_url + "/models") as r:
                data = await r.read()
                status = r.status
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise UpstreamError(f"upstream unreachable: {exc}") from exc
        if status >= 400:
            raise UpstreamError(upstream_message(data, status))
        return data

    async def count_tokens(self, body: dict[str, Any]) -> int:
        # vLLM's /tokenize when the server has one, else a one-token generation's usage.
        root = self.base_url[:-3] if self.base_url.endswith("/v1") else self.base_url
        req = {"model": body.get("model", ""), "messages": body.get("messages", []),
               "add_generation_prompt": True}
        if body.get("tools"):
            req["tools"] = body["tools"]
        try:
            async with self.client.post(root + "/tokenize", data=orjson.dumps(req)) as r:
                if r.status == 200:
                    d = orjson.loads(await r.read())
                    if isinstance(d, dict) and isinstance(d.get("count"), int):
                        return int(d["count"])
            probe = {**{k: v for k, v in body.items() if k != "stream"}, "max_tokens": 1}
            async with self.client.post(self.base_url + "/chat/completions",
                                        data=orjson.dumps(probe)) as r:
                data = await r.read()
                if r.status == 200:
                    d = orjson.loads(data)
                    if isinstance(d, dict) and isinstance(d.get("usage"), dict):
                        return int(d["usage"].get("prompt_tokens", 0))
                raise UpstreamError(f"upstream cannot count tokens (status {r.status})")
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
            raise UpstreamError(f"upstream cannot count tokens: {exc}") from exc


def _completion(d: Any) -> dict[str, Any]:
    if not isinstance(d, dict) or not isinstance(d.get("choices"), list):
        raise ValueError("no choices")
    return d
