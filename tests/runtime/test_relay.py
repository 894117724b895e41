"""The host end of the sandbox relay, driven over its Unix socket with raw bytes and with
the real openai SDK, in front of a real proxy and the built-in model."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import httpx2
import openai
import orjson
import pytest

from tracewire.model import MODEL_NAME
from tracewire.proxy import Proxy, Session
from tracewire.runtime import ProxyEndpoint, SessionRelay


@pytest.fixture
async def relayed(proxy: Proxy) -> AsyncIterator[tuple[SessionRelay, Session, Session]]:
    own, other = proxy.create_session(), proxy.create_session()
    with tempfile.TemporaryDirectory(prefix="tw-relay-") as d:
        relay = SessionRelay(ProxyEndpoint.from_session(own), Path(d) / "s.sock")
        await relay.start()
        try:
            yield relay, own, other
        finally:
            await relay.stop()


async def _raw(relay: SessionRelay, data: bytes) -> bytes:
    r, w = await asyncio.open_unix_connection(relay.socket_path)
    w.write(data)
    await w.drain()
    out = await asyncio.wait_for(r.read(1 << 20), 30)
    w.close()
    return out


def _status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


async def test_openai_sdk_through_the_relay_records_turns(
        relayed: tuple[SessionRelay, Session, Session]) -> None:
    relay, own, _ = relayed
    transport = httpx2.AsyncHTTPTransport(uds=relay.socket_path)
    async with httpx2.AsyncClient(transport=transport) as http:
        client = openai.AsyncOpenAI(base_url=ProxyEndpoint.from_session(own).base_url,
                                    api_key=own.secret, http_client=http, max_retries=0)
        messages: list[dict[str, str]] = [{"role": "user", "content": "hi"}]
        for i in range(3):
            r = await client.chat.completions.create(
                model=MODEL_NAME, messages=messages,  # type: ignore[arg-type]
                max_tokens=8, extra_body={"tracewire": {"force": {"text": f"t{i}"}}})
            messages += [{"role": "assistant", "content": r.choices[0].message.content or ""},
                         {"role": "user", "content": "more"}]
        stream = await client.chat.completions.create(
            model=MODEL_NAME, messages=messages, max_tokens=8, stream=True,  # type: ignore
            extra_body={"tracewire": {"force": {"text": "streamed"}}})
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == "streamed"
    assert len(own.trace.calls) == 4 and relay.forwarded == 4
    assert list(relay.refused) == []


async def test_chunked_body_is_relayed(relayed: tuple[SessionRelay, Session, Session]) -> None:
    relay, own, _ = relayed
    body = orjson.dumps({"model": MODEL_NAME, "max_tokens": 4,
                         "messages": [{"role": "user", "content": "x"}]})
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + 7]), body[i:i + 7])
                      for i in range(0, len(body), 7)) + b"0\r\n\r\n"
    head = (f"POST /sessions/{own.id}/v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: Bearer {own.secret}\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n").encode()
    answer = await _raw(relay, head + chunks)
    assert _status(answer) == 200, answer[:300]
    assert len(own.trace.calls) == 1


@pytest.mark.parametrize("head", [
    "GET /sessions/{sid}/v1/models HTTP/1.1\r\nHost: x\nX: y\r\n",  # bare LF
    "GET /sessions/{sid}/v1/models HTTP/1.1\r\nHost: x\r\n Folded: y\r\n",
    "POST /sessions/{sid}/v1/chat/completions HTTP/1.1\r\nContent-Length: 2\r\n"
    "Transfer-Encoding: chunked\r\n",
    "POST /sessions/{sid}/v1/chat/completions HTTP/1.1\r\nContent-Length: 2\r\n"
    "Content-Length: 3\r\n",
    "POST /sessions/{sid}/v1/chat/completions HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n",
    "GET /sessions/{sid}/v1/models HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n",
    "DELETE /sessions/{sid} HTTP/1.1\r\n",
    "GET /sessions/{sid}/v1/models HTTP/2.0\r\n",
])
async def test_ambiguous_or_odd_requests_are_refused(
        relayed: tuple[SessionRelay, Session, Session], head: str) -> None:
    relay, own, _ = relayed
    raw = (head.format(sid=own.id) + f"Authorization: Bearer {own.secret}\r\n\r\n").encode()
    answer = await _raw(relay, raw)
    assert 400 <= _status(answer) < 500, answer[:200]
    assert len(relay.refused) == 1 and relay.forwarded == 0


async def test_keep_alive_checks_every_request(
        relayed: tuple[SessionRelay, Session, Session]) -> None:
    """A later request on a reused connection is checked too (no smuggling by reuse)."""
    relay, own, other = relayed
    auth = f"Authorization: Bearer {own.secret}\r\n"
    r, w = await asyncio.open_unix_connection(relay.socket_path)
    for _ in range(2):
        w.write(f"GET /sessions/{own.id}/v1/models HTTP/1.1\r\nHost: x\r\n{auth}\r\n".encode())
        head = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 30)
        assert head.startswith(b"HTTP/1.1 200")
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        await r.readexactly(length)
    w.write(f"GET /sessions/{other.id}/v1/models HTTP/1.1\r\nHost: x\r\n{auth}\r\n".encode())
    answer = await asyncio.wait_for(r.read(1 << 16), 30)
    w.close()
    assert answer.startswith(b"HTTP/1.1 403")
    assert relay.forwarded == 2 and len(relay.refused) == 1


async def test_oversized_head_is_refused(
        relayed: tuple[SessionRelay, Session, Session]) -> None:
    relay, own, _ = relayed
    raw = (f"GET /sessions/{own.id}/v1/models HTTP/1.1\r\nX: {'a' * 70000}\r\n\r\n").encode()
    answer = await _raw(relay, raw)
    assert _status(answer) == 431


async def test_connections_are_bounded(proxy: Proxy) -> None:
    own = proxy.create_session()
    with tempfile.TemporaryDirectory(prefix="tw-relay-") as d:
        relay = SessionRelay(ProxyEndpoint.from_session(own), Path(d) / "s.sock",
                             max_connections=2)
        await relay.start()
        try:
            held = [await asyncio.open_unix_connection(relay.socket_path) for _ in range(2)]
            await asyncio.sleep(0.2)
            answer = await _raw(relay, b"GET /v1/models HTTP/1.1\r\n\r\n")
            assert _status(answer) == 503
            for _, w in held:
                w.close()
        finally:
            await relay.stop()
