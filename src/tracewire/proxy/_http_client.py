"""The proxy's HTTP/1.1 client for its one upstream origin: pooled keep-alive connections,
answers parsed by httptools (llhttp, in C), one wake-up per whole answer.

Why not aiohttp's client: the proxy makes one upstream call per turn, and
``aiohttp.ClientSession.post`` spends 130-200 µs of CPU per call on the 2-core VM where
this client spends 50-80 µs (``bench/http_client.py``; bench/README.md, proxy): request
and response objects, header multidicts, a timer context and several tasks' worth of
wake-ups per call, for features an inference server never needs. The harness side stays on
aiohttp's server.

What it does: any method with a bytes body; answers framed by ``Content-Length``, chunked,
or the connection's close; ``gzip``/``deflate`` bodies decoded; a total timeout per call; a
bound on an answer's size; TLS for ``https``. A reused connection the server closed before
sending a byte of its answer is retried once on a fresh one (the keep-alive race: uvicorn,
vLLM's server, closes idle connections after 5 s, and the request was never read).
What it does not: redirects, proxies, cookies, HTTP/2, ``Expect: 100-continue``.
Failures are :class:`~tracewire.UpstreamError` with the message ``upstream failed: ...``;
an unusable URL or header is :class:`~tracewire.UpstreamConfigError` when the client is made.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import time
import zlib
from collections.abc import AsyncIterator
from typing import Any

import httptools
from yarl import URL

from .._errors import UpstreamConfigError, UpstreamError
from .._version import __version__

__all__ = ["Answer", "HttpClient", "Streamed"]

#: A streamed answer's socket pauses while this much is read but not yet taken.
_HIGH_WATER = 1 << 20
#: Connections idle longer than this are closed rather than reused.
_IDLE_S = 15.0


def _failed(why: str) -> UpstreamError:
    return UpstreamError(f"upstream failed: {why}")


class Answer:
    """A whole answer: status, headers (names lower-cased) and the decoded body."""

    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body


class _Decoder:
    """Undoes a ``Content-Encoding`` (gzip or deflate) chunk by chunk."""

    def __init__(self, coding: str) -> None:
        self.gzip = coding in ("gzip", "x-gzip")
        self.obj: Any = zlib.decompressobj(16 + zlib.MAX_WBITS if self.gzip else zlib.MAX_WBITS)
        self.started = False

    def feed(self, data: bytes) -> bytes:
        try:
            out = self.obj.decompress(data)
        except zlib.error:
            if self.gzip or self.started:
                raise
            # "deflate" sent without its zlib header (raw deflate, as some servers do).
            self.obj = zlib.decompressobj(-zlib.MAX_WBITS)
            out = self.obj.decompress(data)
        self.started = True
        return bytes(out)


class _Conn(asyncio.Protocol):
    """One keep-alive connection; serves one exchange at a time. Parser callbacks fill
    the exchange's state and resolve ``waiter``: at the headers in stream mode, at the
    end of the message otherwise."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.lost = False
        self.used = 0
        self.idle_since = 0.0
        self.begin(None, False, 0.0)

    def begin(self, loop: asyncio.AbstractEventLoop | None, stream: bool,
              deadline: float) -> None:
        """Start a new exchange (``loop`` None: no exchange, the state only cleared)."""
        self.waiter: asyncio.Future[None] | None = (
            loop.create_future() if loop is not None else None)
        self.stream = stream
        self.deadline = deadline
        self.used += loop is not None
        self.status = 0
        self.headers: dict[str, str] = {}
        self.parts: list[bytes] = []
        self.size = 0  # of the whole body so far (the bound)
        self.buffered = 0  # stream mode: bytes read but not yet taken
        self.received = False
        self.head_done = False
        self.done = False
        self.keep = False
        self.error: UpstreamError | None = None
        self.decoder: _Decoder | None = None
        self.paused = False
        #: Body bytes still to come of a plain Content-Length answer, taken straight from
        #: the socket once the parser saw the headers (-1: the parser reads the body).
        self.left = -1
        if loop is not None and self.used > 1:
            # A fresh parser per exchange: the last one may have stopped mid-body.
            self.parser = httptools.HttpResponseParser(self)

    # -- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.received = True
        if self.waiter is None or self.done:
            self._fail("the server sent bytes nobody asked for")
            return
        if self.left > 0:
            # Past the headers of a Content-Length answer: the socket's own bytes objects
            # are kept (the parser's body callback would copy each of them once more).
            n = len(data)
            if n > self.left:
                self._fail("the server sent more than its Content-Length")
                return
            self.parts.append(data)
            self.left -= n
            if self.left == 0:
                self._complete()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(f"malformed answer: {exc}")

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost settles the exchange

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.waiter is None or self.done:
            self._wake()
            return
        h = self.headers
        if self.head_done and "content-length" not in h and "chunked" not in h.get(
                "transfer-encoding", ""):
            self.keep = False  # the body was delimited by the close: it is complete
            self._complete()
            return
        why = "the server closed the connection" + (
            " mid-answer" if self.received else " before answering")
        self._fail(f"{why}: {exc}" if exc else why)

    # -- httptools callbacks ---------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.keep = self.parser.should_keep_alive()
        self.head_done = True
        coding = self.headers.get("content-encoding", "identity").strip().lower()
        if coding not in ("identity", ""):
            if coding not in ("gzip", "x-gzip", "deflate"):
                self._fail(f"unsupported content encoding {coding!r}")
                return
            self.decoder = _Decoder(coding)
        elif not self.stream and "transfer-encoding" not in self.headers:
            n = self.headers.get("content-length", "")
            if n.isdigit():
                if int(n) > self.limit:
                    self._fail(f"answer larger than {self.limit} bytes")
                    return
                self.left = int(n)
        if self.stream:
            self._wake()

    def on_body(self, body: bytes) -> None:
        if self.error is not None:
            return
        if self.decoder is not None:
            try:
                body = self.decoder.feed(body)
            except zlib.error as exc:
                self._fail(f"answer body cannot be decoded: {exc}")
                return
        self.size += len(body)  # decoded: a small gzip body cannot grow past the bound
        if self.size > self.limit:
            self._fail(f"answer larger than {self.limit} bytes")
            return
        self.parts.append(body)
        if self.left > 0:
            self.left -= len(body)
        if self.stream:
            self.buffered += len(body)
            if self.buffered > _HIGH_WATER and not self.paused and self.transport is not None:
                self.paused = True
                self.transport.pause_reading()
            self._wake()

    def on_message_complete(self) -> None:
        if self.error is None:
            self.left = -1
            self._complete()

    # -- the exchange ----------------------------------------------------------------------
    def _complete(self) -> None:
        self.done = True
        self._wake()

    def _fail(self, why: str) -> None:
        if self.error is None:
            self.error = _failed(why)
        self.keep = False
        if self.transport is not None:
            self.transport.close()
        self._wake()

    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    def timed_out(self, seconds: float) -> None:
        """The exchange ran past its deadline: fail it and drop the connection."""
        if not self.done:
            self._fail(f"no answer within {seconds:g} s")

    def take(self) -> bytes:
        """The body received so far (resumes a paused socket)."""
        parts, self.parts = self.parts, []
        self.buffered = 0
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def abort(self) -> None:
        """Drop the connection mid-exchange (its caller went away)."""
        self.keep = False
        if self.transport is not None:
            self.transport.abort()


class HttpClient:
    """HTTP/1.1 calls to the origin of ``url`` (its scheme, host and port; a path is
    ignored) over at most ``connections`` pooled connections; ``headers`` go on every
    call, ``timeout`` (s) bounds each whole call and ``max_answer_bytes`` each answer."""

    def __init__(self, url: str, *, headers: dict[str, str] | None = None,
                 timeout: float = 600.0, connections: int = 1024,
                 max_answer_bytes: int = 1 << 30) -> None:
        u = URL(url)
        if u.scheme not in ("http", "https") or not u.host:
            raise UpstreamConfigError(
                f"upstream URL must be http(s)://HOST[:PORT]/..., not {url!r}")
        self.host = u.host
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.ssl: ssl.SSLContext | None = (
            ssl.create_default_context() if u.scheme == "https" else None)
        self.timeout = timeout
        self.connections = connections
        self.max_answer_bytes = max_answer_bytes
        host = u.raw_host or self.host
        if ":" in host:
            host = f"[{host}]"
        if u.explicit_port:
            host = f"{host}:{self.port}"
        # identity: compressing 400 KB of prompt ids costs both ends more CPU than the
        # bytes cost the network they cross; a gzip/deflate answer is decoded all the same.
        fixed = {"Host": host, "User-Agent": f"tracewire/{__version__}", "Accept": "*/*",
                 "Accept-Encoding": "identity", **(headers or {})}
        for k, v in fixed.items():
            if any(c in f"{k}{v}" for c in "\r\n\0"):
                raise UpstreamConfigError(f"header {k!r} holds a line break or NUL")
        self._head = "".join(f"{k}: {v}\r\n" for k, v in fixed.items()).encode("latin-1")
        self._idle: list[_Conn] = []
        self._open = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._closed = False

    # -- calls -----------------------------------------------------------------------------
    async def request(self, method: str, path: str, body: bytes = b"") -> Answer:
        """One call to ``path`` (absolute, with any query); the whole answer."""
        conn = await self._exchange(method, path, body, stream=False)
        answer = Answer(conn.status, conn.headers, conn.take())
        self._release(conn)
        return answer

    def stream(self, method: str, path: str, body: bytes = b"") -> Streamed:
        """One call whose answer is read as it arrives: ``async with client.stream(...) as
        s`` gives the status and headers, then ``async for data in s.chunks()``."""
        return Streamed(self, method, path, body)

    async def close(self) -> None:
        """Close every idle connection; calls in flight close theirs when they end."""
        self._closed = True
        for conn in self._idle:
            if conn.transport is not None:
                conn.transport.close()
        self._idle.clear()
        for w in self._waiters:
            if not w.done():
                w.set_exception(_failed("client closed"))
        self._waiters.clear()

    # -- the pool --------------------------------------------------------------------------
    async def _exchange(self, method: str, path: str, body: bytes, *, stream: bool) -> _Conn:
        """Send the request on a pooled (or new) connection; returns that connection once
        the whole answer is in (in stream mode: once its headers are). A reused
        connection that closes before answering is retried once on a new one."""
        head = b"%s %s HTTP/1.1\r\n%sContent-Length: %d\r\n\r\n" % (
            method.encode("ascii"), path.encode("utf-8"), self._head,
            len(body))
        loop = asyncio.get_running_loop()
        for attempt in (0, 1):
            conn = await self._acquire(fresh=attempt > 0)
            reused = conn.used > 0
            conn.begin(loop, stream, loop.time() + self.timeout)
            transport = conn.transport
            assert transport is not None
            if len(body) <= 65536:
                transport.write(head + body)
            else:  # no copy of a big body
                transport.write(head)
                transport.write(body)
            try:
                await self.settle(conn)
            except UpstreamError:
                self._release(conn)
                if reused and not conn.received and attempt == 0:
                    continue
                raise
            except BaseException:
                conn.abort()
                self._release(conn)
                raise
            return conn
        raise AssertionError("unreachable")

    async def settle(self, conn: _Conn) -> None:
        """Wait for ``conn``'s waiter, under the call's deadline; raise its failure."""
        waiter = conn.waiter
        assert waiter is not None
        if not waiter.done():
            handle = asyncio.get_running_loop().call_at(conn.deadline, conn.timed_out,
                                                        self.timeout)
            try:
                await waiter
            finally:
                handle.cancel()
        if conn.error is not None:
            raise conn.error

    async def _acquire(self, *, fresh: bool) -> _Conn:
        if self._closed:
            raise _failed("client closed")
        if not fresh and (conn := self._pop_idle()) is not None:
            return conn
        while self._open >= self.connections:
            w = asyncio.get_running_loop().create_future()
            self._waiters.append(w)
            try:
                await w
            except asyncio.CancelledError:
                if w.done() and not w.cancelled():
                    self._wake_one()  # woken, then cancelled: pass the wake-up on
                raise
            if not fresh and (conn := self._pop_idle()) is not None:
                return conn
        self._open += 1
        try:
            _, conn = await asyncio.get_running_loop().create_connection(
                lambda: _Conn(self.max_answer_bytes), self.host, self.port, ssl=self.ssl,
                server_hostname=self.host if self.ssl is not None else None)
        except OSError as exc:
            self._open -= 1
            self._wake_one()
            raise _failed(f"cannot connect to {self.host}:{self.port}: {exc}") from exc
        except BaseException:
            self._open -= 1
            self._wake_one()
            raise
        return conn

    def _pop_idle(self) -> _Conn | None:
        """The most recently used idle connection still open and fresh enough; the stale
        ones found on the way are closed."""
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if not conn.lost and now - conn.idle_since < _IDLE_S:
                return conn
            self._drop(conn)
        return None

    def _release(self, conn: _Conn) -> None:
        """Back to the pool when the exchange ended cleanly and the server keeps it."""
        if conn.done and conn.keep and not conn.lost and not self._closed:
            conn.waiter = None
            conn.parts = []
            conn.idle_since = time.monotonic()
            self._idle.append(conn)
        else:
            self._drop(conn)
        self._wake_one()

    def _drop(self, conn: _Conn) -> None:
        self._open -= 1
        conn.waiter = None
        if conn.transport is not None and not conn.lost:
            conn.transport.close()

    def _wake_one(self) -> None:
        while self._waiters:
            w = self._waiters.popleft()
            if not w.done():
                w.set_result(None)
                return


class Streamed:
    """A call whose answer is read as it arrives (see :meth:`HttpClient.stream`)."""

    def __init__(self, client: HttpClient, method: str, path: str, body: bytes) -> None:
        self._client = client
        self._call = (method, path, body)
        self._conn: _Conn | None = None
        self.status = 0
        self.headers: dict[str, str] = {}

    async def __aenter__(self) -> Streamed:
        conn = await self._client._exchange(*self._call, stream=True)
        self._conn = conn
        self.status, self.headers = conn.status, conn.headers
        return self

    async def __aexit__(self, *exc: object) -> None:
        conn = self._conn
        if conn is not None:
            self._conn = None
            if not conn.done:
                conn.abort()
            self._client._release(conn)

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body's (decoded) bytes as they arrive; ends with the answer."""
        conn = self._conn
        assert conn is not None
        loop = asyncio.get_running_loop()
        while True:
            if conn.parts:
                yield conn.take()
                continue
            if conn.error is not None:
                raise conn.error
            if conn.done:
                return
            conn.waiter = loop.create_future()
            await self._client.settle(conn)

    async def read(self) -> bytes:
        """The whole (rest of the) body."""
        return b"".join([data async for data in self.chunks()])
