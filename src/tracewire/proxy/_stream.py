"""Streamed turns: relay upstream chunks to the harness as they arrive, keep the link alive
when the upstream is silent, accumulate the turn and commit it only when it completed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web

from ..trace import Call
from ._dialect import Adapter, UpReq
from ._graph import Outcome
from ._http import error_response, sse_error
from ._upstream import StreamAccumulator, loads_split

if TYPE_CHECKING:
    from ._server import Proxy
    from ._session import Session

__all__ = ["relay_stream"]


class _Gone(Exception):
    """The harness went away mid-stream."""


class _UpstreamFailed(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


async def _lines(content: aiohttp.StreamReader, on_idle: Callable[[], Any], idle_s: float
                 ) -> AsyncIterator[bytes]:
    """SSE lines of any length (aiohttp's readline caps line size; vLLM's first chunk can
    carry a long prompt_token_ids list), calling ``on_idle`` while the upstream is silent."""
    buf = b""
    while True:
        task = asyncio.ensure_future(content.readany())
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=idle_s)
                if done:
                    break
                await on_idle()
        finally:
            if not task.done():
                task.cancel()
        data = task.result()
        if not data:
            if buf:
                yield buf
            return
        buf += data
        if b"\n" in data:
            *lines, buf = buf.split(b"\n")
            for line in lines:
                yield line.rstrip(b"\r")


async def relay_stream(
    proxy: Proxy, request: web.Request, adapter: Adapter, up: UpReq, payload: bytes,
    call: Call, session: Session, commit: Callable[[Outcome], None],
    remember: Callable[[tuple[int, str, bytes | list[bytes]]], None],
) -> web.StreamResponse:
    """Serve one streamed turn; see the module docstring."""
    from ._server import _upstream_message, read_prompt

    client = proxy._client
    assert client is not None
    streamer = adapter.streamer(up)
    idle = proxy.config.keepalive_s
    sent: list[bytes] = []
    resp: web.StreamResponse | None = None

    async def write(b: bytes, keep: bool = True) -> None:
        nonlocal resp
        try:
            if resp is None:
                resp = web.StreamResponse(status=200, headers={
                    "Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
                await resp.prepare(request)
                first = streamer.start()
                if first:
                    sent.append(first)
                    await resp.write(first)
            if keep:
                sent.append(b)
            await resp.write(b)
        except (ConnectionError, RuntimeError) as exc:
            raise _Gone from exc

    async def keepalive() -> None:
        await write(streamer.keepalive, keep=False)

    post = asyncio.ensure_future(client.post(
        proxy.upstream + "/chat/completions", data=payload, headers=proxy._upstream_headers))
    upstream: aiohttp.ClientResponse | None = None
    try:
        try:
            while True:
                done, _ = await asyncio.wait({post}, timeout=idle)
                if done:
                    break
                await keepalive()
            upstream = post.result()
            if upstream.status >= 400:
                data = await upstream.read()
                raise _UpstreamFailed(upstream.status, _upstream_message(data, upstream.status))
            acc = StreamAccumulator()
            finished = False
            async for line in _lines(upstream.content, keepalive, idle):
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    finished = True
                    break
                try:
                    # The chunk carrying the prompt ids (vLLM: the first) keeps them unparsed.
                    d, span = loads_split(data)
                except ValueError as exc:
                    raise _UpstreamFailed(502, f"upstream sent a malformed chunk: {exc}") from exc
                if "error" in d and not d.get("choices"):
                    raise _UpstreamFailed(502, _upstream_message(data, 502))
                acc.add(d, span)
                out_b = streamer.chunk(line, d, span)
                if out_b:
                    await write(out_b)
            out = acc.finish()
            if acc.prompt_span is not None:
                out.prompt = await read_prompt(proxy, session, acc.prompt_span)
            if not out.choices or not (finished or all(c.finish_reason for c in out.choices)):
                raise _UpstreamFailed(502, "upstream stream ended before the answer finished")
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _UpstreamFailed(502, f"upstream failed: {exc or type(exc).__name__}") from exc
    except _UpstreamFailed as exc:
        session.graph.fail(call, exc.message)
        status = exc.status if exc.status < 500 else 502
        if resp is None:
            return error_response(adapter.dialect, status, exc.message)
        try:
            await write(sse_error(adapter.dialect, exc.message))
            await resp.write_eof()
        except (_Gone, ConnectionError, RuntimeError):
            pass
        return resp
    except _Gone:
        session.graph.fail(call, "harness disconnected mid-stream")
        return resp if resp is not None else web.Response(status=499)
    except asyncio.CancelledError:
        session.graph.fail(call, "harness disconnected mid-stream")
        raise
    finally:
        if not post.done():
            post.cancel()
        if upstream is not None:
            upstream.close()
    commit(out)
    try:
        await write(streamer.done(out))
        assert resp is not None
        await resp.write_eof()
    except (_Gone, ConnectionError, RuntimeError):
        pass  # the turn is committed; the harness left after the last token
    remember((200, "text/event-stream", sent))
    assert resp is not None
    return resp
