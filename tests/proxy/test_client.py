"""The lean upstream client against a raw socket server speaking the HTTP/1.1 variants
upstreams use: Content-Length, chunked, close-delimited, gzip, idle keep-alive closes."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import AsyncIterator, Callable

import pytest

from tracewire.proxy._client import UpstreamClient

Reply = Callable[[bytes], list[bytes]]  # request body -> raw response pieces to write


class RawServer:
    def __init__(self) -> None:
        self.reply: Reply = lambda body: [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"]
        self.heads: list[bytes] = []
        self.connections = 0
        self.close_after = False  # close the connection after answering

    async def handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await r.readuntil(b"\r\n\r\n")
                self.heads.append(head)
                n = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                body = await r.readexactly(n)
                for piece in self.reply(body):
                    w.write(piece)
                    await w.drain()
                if self.close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        w.close()


@pytest.fixture
async def raw() -> AsyncIterator[tuple[RawServer, str]]:
    srv = RawServer()
    server = await asyncio.start_server(srv.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    yield srv, f"http://127.0.0.1:{port}/v1"
    server.close()


def _client(url: str) -> UpstreamClient:
    return UpstreamClient(url, limit=4, timeout=5.0,
                          headers={"Content-Type": "application/json", "Authorization": "k"})


async def test_content_length_keepalive_and_head(raw: tuple[RawServer, str]) -> None:
    srv, url = raw
    c = _client(url)
    srv.reply = lambda body: [b"HTTP/1.1 200 OK\r\nContent-Length: ", str(len(body)).encode(),
                              b"\r\n\r\n", body[:3], body[3:]]
    for i in range(3):
        assert await c.post("/chat/completions", b'{"i": %d}' % i) == (200, b'{"i": %d}' % i)
    assert srv.connections == 1
    head = srv.heads[0]
    assert head.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    assert b"Authorization: k\r\n" in head and b"Content-Length: 8\r\n" in head
    c.close()


async def test_chunked_gzip_and_error_status(raw: tuple[RawServer, str]) -> None:
    srv, url = raw
    c = _client(url)
    srv.reply = lambda body: [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
                              b"3\r\nabc\r\n", b"A;ext=1\r\n0123456789\r\n", b"0\r\n\r\n"]
    assert await c.post("/x", b"{}") == (200, b"abc0123456789")
    packed = gzip.compress(b'{"big": true}')
    srv.reply = lambda body: [b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\n"
                              b"Content-Length: %d\r\n\r\n" % len(packed), packed]
    assert await c.post("/x", b"{}") == (200, b'{"big": true}')
    srv.reply = lambda body: [b"HTTP/1.1 500 Oops\r\nContent-Length: 4\r\n\r\nfail"]
    assert await c.post("/x", b"{}") == (500, b"fail")
    assert srv.connections == 1
    c.close()


async def test_close_delimited_and_idle_close(raw: tuple[RawServer, str]) -> None:
    srv, url = raw
    c = _client(url)
    srv.close_after = True
    srv.reply = lambda body: [b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n", b"until", b"eof"]
    assert await c.post("/x", b"{}") == (200, b"untileof")
    # The server answers with a length but closes the connection once idle: the pooled
    # connection is noticed closed and not reused.
    srv.reply = lambda body: [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"]
    assert await c.post("/x", b"{}") == (200, b"ok")
    await asyncio.sleep(0.05)
    assert await c.post("/x", b"{}") == (200, b"ok")
    assert srv.connections == 3
    c.close()


async def test_broken_response_and_unreachable(raw: tuple[RawServer, str]) -> None:
    srv, url = raw
    c = _client(url)
    srv.close_after = True
    srv.reply = lambda body: [b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort"]
    with pytest.raises(ConnectionError):
        await c.post("/x", b"{}")
    srv.reply = lambda body: [b"NOT HTTP\r\n\r\n"]
    with pytest.raises(ConnectionError):
        await c.post("/x", b"{}")
    c.close()
    with pytest.raises(OSError):
        await _client("http://127.0.0.1:9/v1").post("/x", b"{}")
