"""A lean HTTP/1.1 keep-alive client for the upstream's non-streamed chat completions.

aiohttp's client costs ~0.35 ms of CPU per request on the dev VM (request/response objects,
cookie jar, URL handling, header multidicts); the proxy sends one fixed-shape POST per turn,
so it writes the request head from a precomputed template and parses just the status line,
``Content-Length`` / ``Transfer-Encoding: chunked`` / ``Connection`` / ``Content-Encoding``.
Streamed turns and the other routes keep using aiohttp.
"""

from __future__ import annotations

import asyncio
import ssl
import zlib
from collections import deque
from urllib.parse import urlsplit

__all__ = ["UpstreamClient"]

_MAX_HEAD = 64 * 1024


class _Conn(asyncio.Protocol):
    """One connection; parses one response at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.waiter: asyncio.Future[tuple[int, bytes, bool]] | None = None
        self.closed = False
        self.got_bytes = False
        self._status = 0
        self._head_done = False
        self._length = -1  # -1: until EOF; -2: chunked
        self._keep = True
        self._encoding = b""
        self._chunks: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        w = self.waiter
        if w is None or w.done():
            return
        if self._head_done and self._length == -1:
            self._finish(bytes(self.buf), keep=False)  # body delimited by EOF
            return
        w.set_exception(ConnectionError(f"upstream closed the connection{': ' if exc else ''}"
                                        f"{exc or ''}"))

    def start(self, waiter: asyncio.Future[tuple[int, bytes, bool]]) -> None:
        self.waiter = waiter
        self.got_bytes = False
        self._head_done = False
        self._chunks = []

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        self.buf += data
        w = self.waiter
        if w is None or w.done():
            return
        try:
            self._parse()
        except (ValueError, IndexError) as exc:
            self._keep = False
            w.set_exception(ConnectionError(f"upstream sent a malformed response: {exc}"))
            if self.transport is not None:
                self.transport.close()

    def _parse(self) -> None:
        buf = self.buf
        if not self._head_done:
            i = buf.find(b"\r\n\r\n")
            if i < 0:
                if len(buf) > _MAX_HEAD:
                    raise ValueError("response head too large")
                return
            lines = bytes(buf[:i]).split(b"\r\n")
            del buf[:i + 4]
            self._status = int(lines[0].split(None, 2)[1])
            self._length, self._encoding = -1, b""
            self._keep = not lines[0].startswith(b"HTTP/1.0")
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                value = value.strip()
                if name == b"content-length":
                    self._length = int(value)
                elif name == b"transfer-encoding" and b"chunked" in value.lower():
                    self._length = -2
                elif name == b"connection":
                    v = value.lower()
                    self._keep = b"close" not in v and (self._keep or b"keep-alive" in v)
                elif name == b"content-encoding":
                    self._encoding = value.lower()
            if 100 <= self._status < 200:
                return self._parse()  # interim response: the real one follows
            if self._status in (204, 304):
                self._length = 0
            self._head_done = True
        if self._length >= 0:
            if len(buf) >= self._length:
                body = bytes(buf[:self._length])
                del buf[:self._length]
                self._finish(body, self._keep)
        elif self._length == -2:
            self._parse_chunks()

    def _parse_chunks(self) -> None:
        buf = self.buf
        while True:
            i = buf.find(b"\r\n")
            if i < 0:
                return
            size = int(bytes(buf[:i]).split(b";", 1)[0], 16)
            if size == 0:
                end = buf.find(b"\r\n\r\n", i)  # optional trailers, then a blank line
                if end < 0:
                    if buf[i + 2:i + 4] == b"\r\n":
                        end = i
                    else:
                        return
                del buf[:end + 4]
                self._finish(b"".join(self._chunks), self._keep)
                return
            if len(buf) < i + 2 + size + 2:
                return
            self._chunks.append(bytes(buf[i + 2:i + 2 + size]))
            del buf[:i + 2 + size + 2]

    def _finish(self, body: bytes, keep: bool) -> None:
        if self._encoding in (b"gzip", b"x-gzip"):
            body = zlib.decompress(body, 16 + zlib.MAX_WBITS)
        elif self._encoding == b"deflate":
            body = zlib.decompress(body)
        w = self.waiter
        self.waiter = None
        if w is not None and not w.done():
            w.set_result((self._status, body, keep and not self.closed))


class UpstreamClient:
    """POSTs JSON to one upstream over pooled keep-alive connections."""

    def __init__(self, base_url: str, *, limit: int, timeout: float,
                 headers: dict[str, str]) -> None:
        u = urlsplit(base_url)
        self._host = u.hostname or "127.0.0.1"
        self._ssl: ssl.SSLContext | None = (
            ssl.create_default_context() if u.scheme == "https" else None)
        self._port = u.port or (443 if u.scheme == "https" else 80)
        self._prefix = u.path.rstrip("/")
        host = u.netloc.rpartition("@")[2]
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self._head = (f"Host: {host}\r\n{extra}Accept-Encoding: identity\r\n"
                      "Content-Length: ").encode("latin-1")
        self._idle: deque[_Conn] = deque()
        self._slots = asyncio.Semaphore(limit)
        self._timeout = timeout

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        """(status, body) of ``POST {base}{path}``; ``ConnectionError``/``OSError`` when the
        upstream cannot be reached or breaks the response, ``TimeoutError`` past the
        timeout."""
        head = (b"POST " + (self._prefix + path).encode() + b" HTTP/1.1\r\n" + self._head
                + str(len(body)).encode() + b"\r\n\r\n")
        async with self._slots, asyncio.timeout(self._timeout):
            for attempt in (0, 1):
                conn, reused = await self._conn()
                fut: asyncio.Future[tuple[int, bytes, bool]] = (
                    asyncio.get_running_loop().create_future())
                conn.start(fut)
                assert conn.transport is not None
                conn.transport.writelines((head, body))
                try:
                    status, data, keep = await fut
                except ConnectionError:
                    if conn.transport is not None:
                        conn.transport.close()
                    # A pooled connection the server closed while idle: nothing was
                    # answered, so send once more on a fresh one.
                    if reused and not conn.got_bytes and attempt == 0:
                        continue
                    raise
                except BaseException:
                    if conn.transport is not None:
                        conn.transport.close()
                    raise
                if keep:
                    self._idle.append(conn)
                elif conn.transport is not None:
                    conn.transport.close()
                return status, data
        raise AssertionError("unreachable")

    async def _conn(self) -> tuple[_Conn, bool]:
        while self._idle:
            c = self._idle.pop()
            if not c.closed and c.transport is not None and not c.transport.is_closing():
                c.buf.clear()
                return c, True
        loop = asyncio.get_running_loop()
        _, proto = await loop.create_connection(
            _Conn, self._host, self._port, ssl=self._ssl,
            server_hostname=self._host if self._ssl else None)
        return proto, False

    def close(self) -> None:
        """Close every idle connection."""
        while self._idle:
            c = self._idle.pop()
            if c.transport is not None:
                c.transport.close()
