"""Streamed turns: relay upstream chunks to the harness as they arrive, keep the link alive
when the upstream is silent, accumulate the turn and commit it only when it completed."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web

from .._errors import UpstreamError
from ._http import error_response, sse_error
from ._reply import StreamAccumulator
from ._turn import Turn
from ._upstream_api import StreamChunk

__all__ = ["relay_stream"]


class _Gone(Exception):
    """The harness went away mid-stream."""


async def _next(chunks: AsyncIterator[StreamChunk], on_idle: Callable[[], Awaitable[None]],
                idle_s: float) -> StreamChunk | None:
    """The next chunk (None at the end), calling ``on_idle`` while the upstream is silent."""
    task = asyncio.ensure_future(anext(chunks))
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=idle_s)
            if done:
                break
            await on_idle()
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration, Exception):
                await task
    try:
        return task.result()
    except StopAsyncIteration:
        return None


async def relay_stream(request: web.Request, turn: Turn, keepalive_s: float
                       ) -> web.StreamResponse:
    """Serve one streamed turn; see the module docstring."""
    adapter = turn.adapter
    streamer = adapter.streamer(turn.up)
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

    chunks = turn.upstream.stream_chat(turn.request)
    try:
        acc = StreamAccumulator()
        while True:
            c = await _next(chunks, keepalive, keepalive_s)
            if c is None:
                break
            acc.add(c.data, c.span)
            out_b = streamer.chunk(c.line, c.data, c.span)
            if out_b:
                await write(out_b)
        out = acc.finish()
        if acc.prompt_span is not None:
            out.prompt = await turn.read_prompt(acc.prompt_span)
        if not out.choices or not all(ch.finish_reason for ch in out.choices):
            raise UpstreamError("upstream stream ended before the answer finished")
    except UpstreamError as exc:
        turn.fail(str(exc))
        if resp is None:
            return error_response(adapter.dialect, exc.status, str(exc))
        try:
            await write(sse_error(adapter.dialect, str(exc)))
            await resp.write_eof()
        except (_Gone, ConnectionError, RuntimeError):
            pass
        return resp
    except _Gone:
        turn.fail("harness disconnected mid-stream")
        return resp if resp is not None else web.Response(status=499)
    except asyncio.CancelledError:
        turn.fail("harness disconnected mid-stream")
        raise
    finally:
        with contextlib.suppress(Exception):
            await chunks.aclose()  # type: ignore[attr-defined]
    turn.commit(out)
    try:
        await write(streamer.done(out))
        assert resp is not None
        await resp.write_eof()
    except (_Gone, ConnectionError, RuntimeError):
        pass  # the turn is committed; the harness left after the last token
    turn.remember((200, "text/event-stream", sent))
    assert resp is not None
    return resp
