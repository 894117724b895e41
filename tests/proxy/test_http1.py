"""The lean HTTP/1.1 client of non-streamed upstream calls (``proxy._http1``), against raw
asyncio servers on 127.0.0.1 that answer in each framing a server may use."""

from __future__ import annotations

import asyncio
import gzip
import zlib
from collections.abc import Awaitable, Callable

import aiohttp
import pytest
from yarl import URL  # aiohttp's URL type: what aiohttp would send

from tracewire.proxy._http1 import (
    ConnectFailed,
    Disconnected,
    Http1Pool,
    ProtocolError,
    lean_url,
)

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]
HEADERS = {"Content-Type": "application/json", "Authorization": "Bearer k"}


class Server:
    """A raw TCP server: ``handler(reader, writer, connection_number)`` per connection;
    every request read is kept in ``requests``."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.requests: list[bytes] = []
        self.url = ""
        self._srv: asyncio.Server | None = None

    async def read_request(self, reader: asyncio.StreamReader) -> bytes:
        head = await reader.readuntil(b"\r\n\r\n")
        n = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                n = int(line.split(b":")[1])
        req = head + await reader.readexactly(n)
        self.requests.append(req)
        return req

    async def _serve(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(r, w, self.connections)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            w.close()

    async def __aenter__(self) -> Server:
        self._srv = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._srv.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/v1/chat/completions"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._srv is not None
        self._srv.close()


def pool_for(url: str, timeout: float = 30.0) -> tuple[Http1Pool, bytes]:
    origin = lean_url(url)
    assert origin is not None
    return Http1Pool(origin, HEADERS, limit=8, timeout=timeout), Http1Pool.target(origin)


@pytest.mark.parametrize("url", [
    "http://127.0.0.1:8000/v1/chat/completions", "http://LocalHost:8000/v1/chat/completions",
    "http://h:80/v1/chat/completions", "http://h/v1/chat/completions",
    "http://[::1]:8000/v1/chat/completions", "http://h:8000/a:b/c@d/chat/completions",
])
def test_origin_is_what_aiohttp_sends(url: str) -> None:
    origin = lean_url(url)
    u = URL(url)
    assert origin is not None
    assert (origin.hostport, origin.path, origin.port) == (
        u.host_port_subcomponent, u.raw_path, u.port)


@pytest.mark.parametrize("url", [
    "https://h/v1/chat/completions", "http://u:p@h/v1/chat/completions",
    "http://h/v1/chat/completions?x=1", "http://h/v 1/chat/completions",
    "http://h/v%201/chat/completions", "http://h:99999/v1", "http://h/v1#f",
])
def test_other_urls_stay_on_aiohttp(url: str) -> None:
    assert lean_url(url) is None


async def test_request_bytes_are_aiohttps() -> None:
    async def h(r: asyncio.StreamReader, w: asyncio.StreamWriter, _n: int) -> None:
        while True:
            await srv.read_request(r)
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
            await w.drain()

    async with Server(h) as srv:
        body = b'{"model":"m","messages":[]}'
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30),
                                         auto_decompress=True) as c, \
                c.post(srv.url, data=body, headers=HEADERS) as resp:
            assert await resp.read() == b"{}"
        pool, target = pool_for(srv.url)
        assert await pool.post(target, body) == (200, b"{}")
        pool.close()
    assert srv.requests[0] == srv.requests[1]  # the upstream sees the same bytes


async def test_keep_alive_reuses_one_connection_and_splits_anywhere() -> None:
    bodies = [b'{"a":' + str(i).encode() * (70_000 * i + 1) + b"}" for i in range(3)]

    async def h(r: asyncio.StreamReader, w: asyncio.StreamWriter, _n: int) -> None:
        for b in bodies:
            await srv.read_request(r)
            data = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " \
                + str(len(b)).encode() + b"\r\n\r\n" + b
            for i in range(0, len(data), 7_001):  # heads and bodies cut at odd places
                w.write(data[i:i + 7_001])
                await w.drain()

    async with Server(h) as srv:
        pool, target = pool_for(srv.url)
        for b in bodies:
            assert await pool.post(target, b"{}") == (200, b)
        pool.close()
    assert srv.connections == 1


async def test_chunked_with_extensions_and_trailers() -> None:
    async def h(r: asyncio.StreamReader, w: asyncio.StreamWriter, _n: int) -> None:
        await srv.read_request(r)
        w.write(b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n")
        for piece in (b"5;ext=1\r\nhello\r\n", b"1", b"\r\n ", b"\r\n", b"a\r\n0123456789",
                      b"\r\n0\r\nX-Trailer: t\r\n\r\n"):
            w.write(piece)
            await w.drain()
            await asyncio.sleep(0)
        await srv.read_request(r)  # the connection is kept for the next request
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")

    async with Server(h) as srv:
        pool, target = pool_for(srv.url)
        assert await pool.post(target, b"{}") == (201, b"hello 0123456789")
        assert await pool.post(target, b"{}") == (200, b"")
        pool.close()
    assert srv.connections == 1


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "raw-deflate"])
async def test_compressed_answers_are_decoded(encoding: str) -> None:
    text = b'{"choices": []}' * 100
    if encoding == "gzip":
        packed = gzip.compress(text)
    elif encoding == "deflate":
        packed = zlib.compress(text)
    else:
        c = zlib.compressobj(wbits=-zlib.MAX_WBITS)
        packed = c.compress(text) + c.flush()
    name = encoding.removeprefix("raw-").encode()

    async def h(r: asyncio.StreamReader, w: asyncio.StreamWriter, _n: int) -> None:
        await srv.read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\nContent-Encoding: " + name + b"\r\nContent-Length: "
                + str(len(packed)).encode() + b"\r\n\r\n" + packed)

    async with Server(h) as srv:
        pool, target = pool_for(srv.url)
        assert await pool.post(target, b"{}") == (200, text)
        pool.close()


async def test_close_delimited_and_interim_answers() -> None:
    async def h(r: asyncio.StreamReader, w: asyncio.StreamWriter, _n: int) -> None:
        await srv.read_request(r)
        w.write(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.0 500 Oops\r\n\r\nno length")
        await w.drain()

    async with Server(h) as srv:
        pool, target = pool_for(srv.url)
        assert await pool.post(target, b"{}") == (500, b"no length")
        assert await pool.post(target, b"{}") == (500, b"no length")
        pool.close()
    assert srv.connections == 2  # a close-delimited answer ends its connection


async def test_idle_connection_closed_by_the_server_is_replaced() -> None:
    async def h(r: asyncio.StreamReader, w: asyncio.StreamWriter, n: int) -> None:
        await srv.read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n" + str(n).encode())
        await w.drain()
        if n == 1:
            # Closes the kept connection as the next request arrives on it, unanswered.
            await r.readuntil(b"\r\n\r\n")
            w.transport.abort()
            return
        await srv.read_request(r)

    async with Server(h) as srv:
        pool, target = pool_for(srv.url)
        assert await pool.post(target, b"{}") == (200, b"1")
        assert await pool.post(target, b"{}") == (200, b"2")
        pool.close()
    assert srv.connections == 2


async def test_cut_answer_fails_on_a_fresh_connection() -> None:
    async def h(r: asyncio.StreamReader, w: asyncio.StreamWriter, _n: int) -> None:
        await srv.read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort")
        await w.drain()

    async with Server(h) as srv:
        pool, target = pool_for(srv.url)
        with pytest.raises(Disconnected, match="Server disconnected"):
            await pool.post(target, b"{}")
        pool.close()
    assert srv.connections == 1  # not retried: the answer had begun


@pytest.mark.parametrize("answer", [
    b"SPDY/3 200 OK\r\n\r\n",
    b"HTTP/1.1 2000 OK\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Encoding: br\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabcd",
    b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 3\r\n\r\nabc",
    b"HTTP/1.1 200 OK\r\nX-Big: " + b"x" * 70_000 + b"\r\n\r\n",
])
async def test_malformed_answers_are_protocol_errors(answer: bytes) -> None:
    async def h(r: asyncio.StreamReader, w: asyncio.StreamWriter, _n: int) -> None:
        await srv.read_request(r)
        w.write(answer)
        await w.drain()
        await r.read()  # until the client gives up, on what it read

    async with Server(h) as srv:
        pool, target = pool_for(srv.url)
        with pytest.raises(ProtocolError):
            await pool.post(target, b"{}")
        pool.close()


async def test_timeout_and_refused_connection() -> None:
    async def h(r: asyncio.StreamReader, w: asyncio.StreamWriter, _n: int) -> None:
        await srv.read_request(r)
        await asyncio.sleep(30)

    async with Server(h) as srv:
        pool, target = pool_for(srv.url, timeout=0.2)
        with pytest.raises(TimeoutError):
            await pool.post(target, b"{}")
        pool.close()
    pool, target = pool_for("http://127.0.0.1:9/v1/chat/completions")
    with pytest.raises(ConnectFailed, match=r"Cannot connect to host 127\.0\.0\.1:9 ssl:default"):
        await pool.post(target, b"{}")
