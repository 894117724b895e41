"""How ``HttpUpstream.chat`` reads a non-streamed answer: the same bytes whether the upstream
declares its length, sends it chunked or gzipped; a body cut short is an ``UpstreamError``.
Real aiohttp and asyncio servers on 127.0.0.1 (the client itself: test_http_client.py)."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import AsyncIterator, Awaitable, Callable

import orjson
import pytest
from aiohttp import web

from tracewire._errors import UpstreamError
from tracewire.proxy._prompt_cut import cut_ok
from tracewire.proxy._upstream_api import UpstreamRequest
from tracewire.proxy._upstream_http import HttpUpstream

IDS = list(range(100, 90_100))
ANSWER = orjson.dumps({
    "id": "c", "object": "chat.completion", "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                 "finish_reason": "stop", "token_ids": [5, 6]}],
    "prompt_token_ids": IDS})
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def _declared(request: web.Request) -> web.StreamResponse:
    return web.Response(body=ANSWER, content_type="application/json")


async def _chunked(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "application/json"})
    resp.enable_chunked_encoding()
    await resp.prepare(request)
    for i in range(0, len(ANSWER), 50_000):
        await resp.write(ANSWER[i:i + 50_000])
    await resp.write_eof()
    return resp


async def _gzipped(request: web.Request) -> web.StreamResponse:
    return web.Response(body=gzip.compress(ANSWER), headers={
        "Content-Type": "application/json", "Content-Encoding": "gzip"})


async def _serve(handler: Handler) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    finally:
        await runner.cleanup()


async def _ask(url: str) -> tuple[dict[str, object], bytes | None]:
    up = HttpUpstream(url)
    await up.start()
    try:
        replies = [await up.chat(UpstreamRequest(b"{}")) for _ in range(2)]  # reused conn
    finally:
        await up.close()
    assert replies[0].raw == replies[1].raw
    reply = replies[-1]
    assert reply.span is not None and cut_ok(reply.data, "prompt_token_ids")
    assert orjson.loads(reply.span.view()) == IDS
    return reply.data, reply.raw


@pytest.mark.parametrize("handler", [_declared, _chunked, _gzipped])
async def test_every_framing_reads_the_same_answer(handler: Handler) -> None:
    async for url in _serve(handler):
        data, raw = await _ask(url)
        assert raw == ANSWER
        assert data["choices"] == orjson.loads(ANSWER)["choices"]


async def test_an_answer_cut_short_is_an_upstream_error() -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (await reader.readline()) not in (b"\r\n", b""):
            pass
        await reader.readexactly(2)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(ANSWER) + ANSWER[:300_000])
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    up = HttpUpstream(f"http://127.0.0.1:{port}/v1")
    await up.start()
    try:
        with pytest.raises(UpstreamError, match="upstream failed"):
            await up.chat(UpstreamRequest(b"{}"))
    finally:
        await up.close()
        server.close()
        await server.wait_closed()
