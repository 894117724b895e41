"""The proxy's HTTP/1.1 client (``_http_client``): framing, the pool, the keep-alive race,
bounds, timeouts and streams. Real asyncio servers on 127.0.0.1 that write the answer's
bytes by hand, so each case is exactly the wire it names."""

from __future__ import annotations

import asyncio
import gzip
import subprocess
import sys
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from tracewire._errors import UpstreamConfigError, UpstreamError
from tracewire.proxy._http_client import HttpClient

Answerer = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[bool]]


async def _read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes] | None:
    """The request line and body of one request (None at EOF)."""
    line = await reader.readline()
    if not line:
        return None
    length = 0
    while (h := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = h.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return line, await reader.readexactly(length)


class Server:
    """Serves requests with ``answer(reader, writer, n)`` (n counts requests over all
    connections); ``answer`` returns whether to keep the connection."""

    def __init__(self, answer: Answerer) -> None:
        self.answer = answer
        self.requests: list[tuple[bytes, bytes]] = []
        self.connections = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while (req := await _read_request(reader)) is not None:
                self.requests.append(req)
                if not await self.answer(reader, writer, len(self.requests)):
                    break
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


async def _serve(answer: Answerer) -> AsyncIterator[tuple[Server, str]]:
    srv = Server(answer)
    server = await asyncio.start_server(srv.handle, "127.0.0.1", 0)
    try:
        yield srv, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
    finally:
        server.close()
        await server.wait_closed()


def _ok(body: bytes, extra: bytes = b"") -> bytes:
    return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + extra
            + b"Content-Length: %d\r\n\r\n" % len(body) + body)


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> bool:
    writer.write(_ok(b'{"n":%d}' % n))
    await writer.drain()
    return True


async def test_calls_reuse_one_connection_and_send_the_head() -> None:
    async for srv, url in _serve(_echo):
        client = HttpClient(url, headers={"Authorization": "Bearer k"})
        for i in range(1, 4):
            a = await client.request("POST", "/v1/chat/completions", b'{"x":1}')
            assert (a.status, a.body) == (200, b'{"n":%d}' % i)
            assert a.headers["content-type"] == "application/json"
        await client.close()
        assert srv.connections == 1
        assert srv.requests[0] == (b"POST /v1/chat/completions HTTP/1.1\r\n", b'{"x":1}')


async def test_framings_chunked_close_delimited_gzip_and_deflate() -> None:
    body = b'{"a":"' + b"x" * 50_000 + b'"}'

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     n: int) -> bool:
        if n == 1:
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            for i in range(0, len(body), 7_000):
                part = body[i:i + 7_000]
                writer.write(b"%x\r\n" % len(part) + part + b"\r\n")
            writer.write(b"0\r\n\r\n")
        elif n == 2:
            writer.write(_ok(gzip.compress(body), b"Content-Encoding: gzip\r\n"))
        elif n == 3:
            writer.write(_ok(zlib.compress(body), b"Content-Encoding: deflate\r\n"))
        else:  # no length, no chunks: the close ends the body
            writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + body)
            await writer.drain()
            return False
        await writer.drain()
        return True

    async for srv, url in _serve(answer):
        client = HttpClient(url)
        got = [(await client.request("GET", "/")).body for _ in range(4)]
        assert got == [body] * 4
        await client.close()
        assert srv.connections == 1


async def test_a_reused_connection_closed_before_answering_is_retried_once() -> None:
    # The keep-alive race: the server drops an idle connection as the next call arrives.
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     n: int) -> bool:
        if n == 2:
            return False  # closed with the request unanswered
        return await _echo(reader, writer, n)

    async for srv, url in _serve(answer):
        client = HttpClient(url)
        assert (await client.request("POST", "/", b"1")).body == b'{"n":1}'
        assert (await client.request("POST", "/", b"2")).body == b'{"n":3}'
        await client.close()
        assert srv.connections == 2


async def test_a_fresh_connection_closed_before_answering_fails() -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     n: int) -> bool:
        return False

    async for srv, url in _serve(answer):
        client = HttpClient(url)
        with pytest.raises(UpstreamError, match="closed the connection before answering"):
            await client.request("POST", "/", b"1")
        assert len(srv.requests) == 1  # not retried: the connection was new
        await client.close()


async def test_bounds_and_malformed_answers_fail_and_the_client_goes_on() -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     n: int) -> bool:
        if n == 1:
            writer.write(_ok(b"y" * 5_000))
        elif n == 2:
            writer.write(_ok(gzip.compress(b"z" * 100_000), b"Content-Encoding: gzip\r\n"))
        elif n == 3:
            writer.write(_ok(b"{}", b"Content-Encoding: br\r\n"))
        elif n == 4:
            writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        else:
            writer.write(_ok(b"{}"))
        await writer.drain()
        return True

    async for srv, url in _serve(answer):
        client = HttpClient(url, max_answer_bytes=4_096)
        with pytest.raises(UpstreamError, match="larger than 4096 bytes"):
            await client.request("GET", "/")
        with pytest.raises(UpstreamError, match="larger than 4096 bytes"):  # decoded size
            await client.request("GET", "/")
        with pytest.raises(UpstreamError, match="unsupported content encoding 'br'"):
            await client.request("GET", "/")
        with pytest.raises(UpstreamError, match="malformed answer"):
            await client.request("GET", "/")
        assert (await client.request("GET", "/")).body == b"{}"
        await client.close()
        assert srv.connections == 5  # each failure dropped its connection


async def test_a_call_past_its_timeout_fails_and_a_refused_connect_is_an_upstream_error(
) -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     n: int) -> bool:
        await asyncio.sleep(5)
        return False

    async for _, url in _serve(answer):
        client = HttpClient(url, timeout=0.2)
        with pytest.raises(UpstreamError, match=r"no answer within 0\.2 s"):
            await client.request("POST", "/", b"{}")
        await client.close()
    client = HttpClient("http://127.0.0.1:9/v1")
    with pytest.raises(UpstreamError, match="upstream failed: cannot connect"):
        await client.request("GET", "/")


async def test_the_pool_bounds_connections_and_a_cancelled_call_frees_its_own() -> None:
    gate = asyncio.Event()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     n: int) -> bool:
        if n == 1:
            await gate.wait()
        return await _echo(reader, writer, n)

    async for srv, url in _serve(answer):
        client = HttpClient(url, connections=1)
        stuck = asyncio.create_task(client.request("POST", "/", b"1"))
        await asyncio.sleep(0.05)
        waiting = [asyncio.create_task(client.request("POST", "/", b"%d" % i))
                   for i in (2, 3)]
        await asyncio.sleep(0.05)
        assert srv.connections == 1 and not any(t.done() for t in waiting)
        stuck.cancel()  # its connection is mid-exchange: dropped, and a new one opened
        bodies = sorted([(await t).body for t in waiting])
        assert bodies == [b'{"n":2}', b'{"n":3}']
        assert srv.connections == 2
        gate.set()
        await client.close()


async def test_a_stream_arrives_in_pieces_and_pauses_the_socket_when_not_read() -> None:
    piece = b"data: " + b"p" * 100_000 + b"\n\n"

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     n: int) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(40):  # 4 MB: past the high-water mark if nobody reads
            writer.write(b"%x\r\n" % len(piece) + piece + b"\r\n")
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True

    async for srv, url in _serve(answer):
        client = HttpClient(url)
        async with client.stream("POST", "/", b"{}") as s:
            assert s.status == 200
            await asyncio.sleep(0.2)  # let the server run ahead of us
            got = [data async for data in s.chunks()]
        assert b"".join(got) == piece * 40 and len(got) > 1
        async with client.stream("POST", "/", b"{}") as s:  # the connection was kept
            assert await s.read() == piece * 40
        # Stopping early drops the connection instead of returning it mid-answer.
        async with client.stream("POST", "/", b"{}") as s:
            async for _ in s.chunks():
                break
        assert (await client.request("GET", "/")).status == 200
        await client.close()
        assert srv.connections == 2


def test_a_header_with_a_line_break_or_a_foreign_url_is_refused() -> None:
    with pytest.raises(UpstreamConfigError, match="line break"):
        HttpClient("http://127.0.0.1:1/v1", headers={"Authorization": "Bearer k\r\nX: y"})
    with pytest.raises(UpstreamConfigError, match="must be http"):
        HttpClient("ftp://127.0.0.1/v1")


async def test_a_body_in_pieces_is_read_whole_and_bytes_past_its_length_fail() -> None:
    body = b"b" * 300_000

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     n: int) -> bool:
        writer.write(_ok(body)[:-200_000])  # the head and part of the body, then the rest
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(body[-200_000:] + (b"extra" if n == 2 else b""))
        await writer.drain()
        return True

    async for _, url in _serve(answer):
        client = HttpClient(url)
        assert (await client.request("GET", "/")).body == body
        with pytest.raises(UpstreamError, match="more than its Content-Length"):
            await client.request("GET", "/")
        assert (await client.request("GET", "/")).body == body
        await client.close()


def test_the_proxy_command_says_what_is_wrong_with_a_bad_upstream_url() -> None:
    r = subprocess.run([sys.executable, "-m", "tracewire", "proxy", "--upstream",
                        "localhost:8000/v1"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip() == ("tracewire proxy: upstream URL must be "
                                "http(s)://HOST[:PORT]/..., not 'localhost:8000/v1'")
