"""A lean HTTP/1.1 client for the upstream's non-streamed calls: one POST, one buffered answer.

aiohttp's client costs ~0.1 ms of CPU per request on the development VM (request and
response objects, connector, timers, tracing hooks), about as much as the rest of a proxied
turn. This client keeps a pool of keep-alive connections to one ``http://`` origin and
parses answers with plain byte operations; it sends the same request bytes aiohttp would
(same headers, same order), accepts ``Content-Length``, chunked and close-delimited bodies,
and decodes ``gzip``/``deflate`` as aiohttp does. Streams, TLS and everything else stay on
aiohttp (:mod:`._upstream_http`).
"""

from __future__ import annotations

import asyncio
import re
import sys
import zlib
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp

__all__ = ["ConnectFailed", "Disconnected", "Http1Pool", "Origin", "ProtocolError", "lean_url"]

#: Most bytes of a status line and headers accepted.
MAX_HEAD = 64 * 1024
_CRLF2 = b"\r\n\r\n"
_USER_AGENT = (f"Python/{sys.version_info[0]}.{sys.version_info[1]} "
               f"aiohttp/{aiohttp.__version__}")


class ProtocolError(OSError):
    """The upstream's answer is not HTTP/1.x this client reads (an ``OSError``: the call
    failed on the wire)."""


class Disconnected(ProtocolError):
    """The connection closed before a whole answer arrived."""

    def __init__(self, message: str = "Server disconnected", *, nothing_read: bool = False
                 ) -> None:
        super().__init__(message)
        #: Not one byte of the answer arrived (a reused connection the server had closed).
        self.nothing_read = nothing_read


class ConnectFailed(ProtocolError):
    """No connection to the upstream (worded as aiohttp words it, so error texts recorded on
    traces read the same)."""


#: Paths written as they are (aiohttp would quote or normalize anything else).
_PLAIN_PATH = re.compile(r"/[A-Za-z0-9._~!$&'()*+,;=:@/-]*")
_PLAIN_HOST = re.compile(r"[a-z0-9.-]+|[0-9a-f:.]+")


@dataclass(slots=True, frozen=True)
class Origin:
    """Where a lean request goes: the address to connect to, the ``Host`` header's value
    and the request target."""

    host: str
    port: int
    hostport: str
    path: str


def lean_url(url: str) -> Origin | None:
    """``url`` as an :class:`Origin` when this client can serve it (plain ``http://``, no
    credentials, query or fragment, a path and host aiohttp sends unchanged); None
    otherwise (aiohttp serves it)."""
    try:
        u = urlsplit(url)
        port = u.port or 80
    except ValueError:
        return None
    host = u.hostname or ""
    if u.scheme != "http" or "@" in u.netloc or u.query or u.fragment or "#" in url:
        return None
    if not _PLAIN_HOST.fullmatch(host) or not _PLAIN_PATH.fullmatch(u.path or "/"):
        return None
    shown = f"[{host}]" if ":" in host else host
    return Origin(host, port, shown if port == 80 else f"{shown}:{port}", u.path or "/")


class _Conn(asyncio.Protocol):
    """One keep-alive connection; reads one answer per request."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reused = False
        self._fut: asyncio.Future[tuple[int, bytes, bool]] | None = None
        self._head = bytearray()
        self._status = 0
        self._keep = True
        self._encoding = ""
        self._mode = 0  # 0: head, 1: by length, 2: chunked, 3: until close
        self._need = 0
        self._parts: list[bytes] = []
        self._chunk = bytearray()
        self._got_any = False
        self._chunk_left = -1

    # -- asyncio callbacks ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        fut = self._fut
        if fut is None or fut.done():
            return
        if self._mode == 3:
            self._complete(b"".join(self._parts), keep=False)
            return
        fut.set_exception(Disconnected(nothing_read=not self._got_any))

    def eof_received(self) -> bool:
        self.closed = True
        return False  # close the transport; connection_lost finishes the answer

    def data_received(self, data: bytes) -> None:
        if self._fut is None or self._fut.done():
            self._fail(ProtocolError("upstream sent bytes outside an answer"))
            return
        self._got_any = True
        try:
            self._feed(data)
        except ProtocolError as exc:
            self._fail(exc)

    # -- one exchange -----------------------------------------------------------------------
    def request(self, data: bytes) -> asyncio.Future[tuple[int, bytes, bool]]:
        """Send ``data`` (a whole request); the future gives (status, body, reusable)."""
        assert self.transport is not None
        fut = self._fut = asyncio.get_running_loop().create_future()
        self._mode, self._got_any, self._keep, self._encoding = 0, False, True, ""
        self._head.clear()
        self._parts = []
        self.transport.write(data)
        return fut

    def abort(self) -> None:
        """Drop the connection (an answer cut short cannot be resumed)."""
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def _fail(self, exc: Exception) -> None:
        fut = self._fut
        if fut is not None and not fut.done():
            fut.set_exception(exc)
        self.abort()

    def _complete(self, body: bytes, *, keep: bool) -> None:
        fut = self._fut
        assert fut is not None
        if self._encoding:
            try:
                body = _decode(body, self._encoding)
            except (zlib.error, ProtocolError) as exc:
                fut.set_exception(ProtocolError(f"undecodable answer body: {exc}"))
                self.abort()
                return
        fut.set_result((self._status, body, keep and self._keep and not self.closed))

    def _feed(self, data: bytes) -> None:
        mode = self._mode
        if mode == 1:
            self._body_bytes(data)
        elif mode == 0:
            self._head_bytes(data)
        elif mode == 2:
            self._chunk += data
            self._chunks()
        else:
            self._parts.append(data)

    def _head_bytes(self, data: bytes) -> None:
        head = self._head
        start = max(0, len(head) - 3)
        head += data
        i = head.find(_CRLF2, start)
        if i < 0 or i > MAX_HEAD:
            if len(head) > MAX_HEAD:
                raise ProtocolError("upstream answer head over 64 KiB")
            return
        rest = bytes(head[i + 4:])
        self._parse_head(bytes(head[:i]))
        del head[:]
        if self._mode == 0:  # an interim 1xx answer: the real one follows
            if rest:
                self._head_bytes(rest)
            return
        if rest or self._mode == 1:
            self._feed(rest)

    def _parse_head(self, head: bytes) -> None:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or len(parts[1]) != 3 \
                or not parts[1].isdigit():
            raise ProtocolError(f"not an HTTP/1.x status line: {lines[0][:100]!r}")
        status = int(parts[1])
        length: int | None = None
        chunked = False
        keep = parts[0] != "HTTP/1.0"
        encoding = ""
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                raise ProtocolError(f"malformed header line: {line[:100]!r}")
            name = name.strip().lower()
            value = value.strip()
            if name == "content-length":
                if not value.isdigit() or (length is not None and int(value) != length):
                    raise ProtocolError(f"bad Content-Length: {value[:40]!r}")
                length = int(value)
            elif name == "transfer-encoding":
                codings = [c.strip().lower() for c in value.split(",")]
                if codings[-1] != "chunked" or len(codings) > 1:
                    raise ProtocolError(f"unsupported Transfer-Encoding: {value[:40]!r}")
                chunked = True
            elif name == "connection":
                tokens = {c.strip().lower() for c in value.split(",")}
                if "close" in tokens:
                    keep = False
                elif "keep-alive" in tokens:
                    keep = True
            elif name == "content-encoding":
                encoding = value.lower()
                if encoding == "identity":
                    encoding = ""
                elif encoding not in ("gzip", "deflate", "x-gzip"):
                    raise ProtocolError(f"unsupported Content-Encoding: {value[:40]!r}")
        if 100 <= status < 200:
            if status == 101:
                raise ProtocolError("upstream switched protocols")
            return  # interim answer: keep reading heads
        self._status, self._keep, self._encoding = status, keep, encoding
        if status in (204, 304):
            self._mode = 1
            self._need = 0
        elif chunked:
            self._mode = 2
            self._chunk = bytearray()
            self._chunk_left = -1
        elif length is not None:
            self._mode = 1
            self._need = length
        else:
            self._mode = 3
            self._keep = False

    def _body_bytes(self, data: bytes) -> None:
        need = self._need
        n = len(data)
        if n < need:
            self._parts.append(data)
            self._need = need - n
            return
        parts = self._parts
        if n > need:
            # Bytes past the answer: not a keep-alive peer we understand.
            data = data[:need]
            self._keep = False
        if parts:
            parts.append(data)
            body = b"".join(parts)
        else:
            body = data
        self._parts = []
        self._complete(body, keep=True)

    def _chunks(self) -> None:
        buf = self._chunk
        while True:
            left = self._chunk_left
            if left == -1:  # expecting a size line
                i = buf.find(b"\r\n")
                if i < 0:
                    if len(buf) > 4096:
                        raise ProtocolError("chunk size line too long")
                    return
                size_text = bytes(buf[:i]).split(b";", 1)[0].strip()
                try:
                    size = int(size_text, 16)
                except ValueError:
                    raise ProtocolError(f"bad chunk size: {size_text[:20]!r}") from None
                if size < 0:
                    raise ProtocolError("bad chunk size")
                del buf[:i + 2]
                if size == 0:
                    self._chunk_left = -2
                else:
                    self._chunk_left = size
                continue
            if left == -2:  # trailers until an empty line
                i = buf.find(b"\r\n")
                if i < 0:
                    if len(buf) > MAX_HEAD:
                        raise ProtocolError("chunk trailers too long")
                    return
                line = bytes(buf[:i])
                del buf[:i + 2]
                if not line:
                    keep = not buf
                    self._complete(b"".join(self._parts), keep=keep)
                    return
                continue
            if len(buf) < left + 2:
                return
            if buf[left:left + 2] != b"\r\n":
                raise ProtocolError("chunk not followed by CRLF")
            self._parts.append(bytes(buf[:left]))
            del buf[:left + 2]
            self._chunk_left = -1


def _decode(body: bytes, encoding: str) -> bytes:
    if encoding in ("gzip", "x-gzip"):
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        out = d.decompress(body) + d.flush()
        if not d.eof:
            raise ProtocolError("truncated gzip body")
        return out
    try:  # deflate: zlib-wrapped as the RFC says, or raw as some servers send it
        return zlib.decompress(body)
    except zlib.error:
        return zlib.decompress(body, -zlib.MAX_WBITS)


class Http1Pool:
    """Keep-alive connections to the origin of ``url`` (at most ``limit`` at once); each
    :meth:`post` sends one request and reads the whole answer within ``timeout`` seconds."""

    def __init__(self, origin: Origin, headers: dict[str, str], *, limit: int, timeout: float
                 ) -> None:
        self.host = origin.host
        self.port = origin.port
        self.timeout = timeout
        self._idle: list[_Conn] = []
        self._slots = asyncio.Semaphore(max(1, limit))
        lines = [f"Host: {origin.hostport}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        lines += ["Accept: */*", "Accept-Encoding: gzip, deflate", f"User-Agent: {_USER_AGENT}",
                  "Content-Length: "]
        #: Everything after the request line up to the body length's digits.
        self._headers = ("\r\n".join(lines)).encode("latin-1")

    @staticmethod
    def target(origin: Origin) -> bytes:
        """The request-target bytes of ``origin`` (its path, as aiohttp writes it)."""
        return origin.path.encode("ascii")

    async def post(self, target: bytes, body: bytes) -> tuple[int, bytes]:
        """POST ``body`` to ``target``: (status, answer body). ``OSError`` subclasses when
        the call failed on the wire, ``TimeoutError`` past the timeout."""
        data = b"".join((b"POST ", target, b" HTTP/1.1\r\n", self._headers,
                         str(len(body)).encode(), _CRLF2, body))
        async with self._slots, asyncio.timeout(self.timeout):
            for attempt in (0, 1):
                conn = await self._conn()
                try:
                    status, answer, keep = await conn.request(data)
                except Disconnected as exc:
                    conn.abort()
                    # The server closed an idle connection as we reused it: the request was
                    # never read, so it is sent once more on a fresh connection.
                    if attempt == 0 and conn.reused and exc.nothing_read:
                        continue
                    raise
                except BaseException:
                    conn.abort()
                    raise
                if keep:
                    conn.reused = True
                    self._idle.append(conn)
                else:
                    conn.abort()
                return status, answer
        raise AssertionError("unreachable")  # pragma: no cover

    async def _conn(self) -> _Conn:
        idle = self._idle
        while idle:
            c = idle.pop()
            if not c.closed and c.transport is not None and not c.transport.is_closing():
                return c
        loop = asyncio.get_running_loop()
        try:
            _, conn = await loop.create_connection(_Conn, self.host, self.port)
        except OSError as exc:
            why = exc.strerror or str(exc)
            raise ConnectFailed(f"Cannot connect to host {self.host}:{self.port} ssl:default "
                                f"[{why}]") from exc
        return conn

    def close(self) -> None:
        """Close every idle connection."""
        for c in self._idle:
            c.abort()
        self._idle.clear()

    def __repr__(self) -> str:
        return f"Http1Pool({self.host}:{self.port}, idle={len(self._idle)})"
