"""The streamed form of a turn's ask, read and render steps: upstream chunks relayed to the
harness as they arrive (keepalives while the upstream is silent), accumulated into the
turn's :class:`Outcome`; the turn pipeline (``_turn``) commits it and then closes the
stream, so a harness that leaves after the last token still has its turn recorded."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from aiohttp import web

from ._adapter import Streamer
from ._http import Dialect, sse_error
from ._rawjson import RawSpan
from ._reply import StreamAccumulator
from ._turn_types import Outcome
from ._upstream_api import StreamChunk

__all__ = ["Gone", "StreamRelay"]


class Gone(Exception):
    """The harness went away mid-stream."""


class StreamRelay:
    """The harness's side of one streamed answer: the event-stream response (opened on the
    first write), every part sent (kept for SDK retries), keepalives while waiting."""

    __slots__ = ("keepalive_s", "request", "resp", "sent", "streamer")

    def __init__(self, request: web.Request, streamer: Streamer, keepalive_s: float) -> None:
        self.request = request
        self.streamer = streamer
        self.keepalive_s = keepalive_s
        self.resp: web.StreamResponse | None = None
        self.sent: list[bytes] = []

    async def write(self, b: bytes, keep: bool = True) -> None:
        """Send ``b`` (kept for retries unless ``keep`` is false); ``Gone`` when the
        harness left."""
        try:
            if self.resp is None:
                self.resp = web.StreamResponse(status=200, headers={
                    "Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
                await self.resp.prepare(self.request)
                first = self.streamer.start()
                if first:
                    self.sent.append(first)
                    await self.resp.write(first)
            if keep:
                self.sent.append(b)
            await self.resp.write(b)
        except (ConnectionError, RuntimeError) as exc:
            raise Gone from exc

    async def relay(self, chunks: AsyncIterator[StreamChunk]
                    ) -> tuple[Outcome, RawSpan | None]:
        """Relay every chunk, rendered by the streamer; returns the accumulated outcome and
        where its prompt ids lie when a chunk carried them unparsed. ``UpstreamError`` when
        the stream breaks, ``Gone`` when the harness left."""
        acc = StreamAccumulator()
        streamer = self.streamer
        while True:
            c = await self._next(chunks)
            if c is None:
                break
            acc.add(c.data, c.span)
            out_b = streamer.chunk(c.line, c.data, c.span)
            if out_b:
                await self.write(out_b)
        return acc.finish(), acc.prompt_span

    async def _next(self, chunks: AsyncIterator[StreamChunk]) -> StreamChunk | None:
        """The next chunk (None at the end), with keepalives while the upstream is silent."""
        task = asyncio.ensure_future(anext(chunks))
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=self.keepalive_s)
                if done:
                    break
                await self.write(self.streamer.keepalive, keep=False)
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration, Exception):
                    await task
        try:
            return task.result()
        except StopAsyncIteration:
            return None

    async def error(self, dialect: Dialect, message: str) -> web.StreamResponse | None:
        """End an opened stream with an error event (None when nothing was sent yet: the
        caller answers with a plain error response)."""
        if self.resp is None:
            return None
        try:
            await self.write(sse_error(dialect, message))
            await self.resp.write_eof()
        except (Gone, ConnectionError, RuntimeError):
            pass
        return self.resp

    async def close(self, last: bytes) -> web.StreamResponse:
        """Send the closing bytes and end the stream (a harness gone by now is ignored)."""
        try:
            await self.write(last)
            assert self.resp is not None
            await self.resp.write_eof()
        except (Gone, ConnectionError, RuntimeError):
            pass  # the turn is committed; the harness left after the last token
        assert self.resp is not None
        return self.resp
