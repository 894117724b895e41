"""Malformed and odd input at the proxy's boundary: every refusal is a dialect-correct 4xx
(never a 5xx, which SDKs retry), the proxy keeps serving, and whatever it accepted is
recorded in a trace that encodes, decodes and reads back from a store."""

from __future__ import annotations

import asyncio
import gzip
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import orjson
import pytest

from tracewire.proxy import Proxy, Session

from .fake_upstream import Fake
from .readable import assert_codec_roundtrip, assert_store_roundtrip

PATHS = {"chat": "/v1/chat/completions", "messages": "/v1/messages",
         "responses": "/v1/responses"}
OK = {
    "chat": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    "messages": {"model": "m", "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]},
    "responses": {"model": "m", "input": "hi"},
}


def _deep(n: int) -> bytes:
    return b"[" * n + b"]" * n


async def _post(proxy: Proxy, s: Session, endpoint: str, body: bytes | dict[str, Any],
                headers: dict[str, str] | None = None) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    h = {"Authorization": f"Bearer {s.secret}", "Content-Type": "application/json",
         **(headers or {})}
    async with aiohttp.ClientSession(auto_decompress=False) as c, c.post(
            proxy.url + PATHS[endpoint], data=data, headers=h) as r:
        raw = await r.read()
        return r.status, orjson.loads(raw) if raw else None


def _error_shape(endpoint: str, d: Any) -> str:
    """The message of a dialect-correct error body (fails the test if the shape is off)."""
    if endpoint == "messages":
        assert d["type"] == "error" and d["error"]["type"] == "invalid_request_error", d
    else:
        assert d["error"]["type"] == "invalid_request_error", d
    msg = d["error"]["message"]
    assert isinstance(msg, str) and msg
    return msg


async def _refused(proxy: Proxy, endpoint: str, body: bytes | dict[str, Any],
                   headers: dict[str, str] | None = None, status: int = 400) -> str:
    s = proxy.create_session()
    got, d = await _post(proxy, s, endpoint, body, headers)
    assert got == status, (got, d)
    msg = _error_shape(endpoint, d)
    # Still serving, and the session's trace is still readable.
    got, d = await _post(proxy, s, endpoint, OK[endpoint])
    assert got == 200, d
    assert_codec_roundtrip(s.trace)
    return msg


# -- item 1: what is accepted must be readable -------------------------------------------

CHAT_BAD_FIELDS = [
    {"role": "tool", "tool_call_id": 123, "content": "42"},
    {"role": "user", "name": {"x": 1}, "content": "hi"},
    {"role": "user", "content": [1, 2]},
    {"role": "user", "content": [{"type": "text", "text": "a"}, "b"]},
    {"role": "user", "content": 5},
    {"role": 5, "content": "hi"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "function": 5}]},
    {"role": "assistant", "content": None, "tool_calls": "x"},
    {"role": "assistant", "content": "x", "reasoning_content": 5},
]


@pytest.mark.parametrize("msg", CHAT_BAD_FIELDS, ids=range(len(CHAT_BAD_FIELDS)))
async def test_chat_field_types_refused(proxy: Proxy, msg: dict[str, Any]) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}, msg]}
    text = await _refused(proxy, "chat", body)
    assert "messages[1]" in text


async def test_chat_deep_content_refused(proxy: Proxy) -> None:
    n = 300  # past what orjson writes (254 levels), well within what it reads
    part = b'{"type":"x","nest":' * n + b'"x"' + b"}" * n
    body = b'{"model":"m","messages":[{"role":"user","content":[' + part + b"]}]}"
    assert "deep" in await _refused(proxy, "chat", body)


async def test_odd_but_valid_chat_is_recorded_readably(proxy: Proxy, tmp_path: Path) -> None:
    s = proxy.create_session()
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": [{"type": "text", "text": "be "}, {"type": "text",
                                                                      "text": "brief"}]},
        {"role": "user", "name": "bob", "content": [
            {"type": "text", "text": "look"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA",
                                                "detail": "low"}, "extra": [1, 2.5, None]}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "7", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]},
        {"role": "tool", "tool_call_id": "7", "content": "ok"},
        {"role": "user", "content": "tool said ok"},
    ]
    got, d = await _post(proxy, s, "chat", {"model": "m", "messages": msgs,
                                            "stop": ["\n", "x"], "temperature": 0.5,
                                            "tool_choice": {"type": "function",
                                                            "function": {"name": "f"}}})
    assert got == 200, d
    assert [n.message.role for n in s.trace.nodes] == [
        "system", "user", "assistant", "tool", "user", "assistant"]
    assert s.trace.calls[0].sampling["stop"] == ["\n", "x"]
    assert_codec_roundtrip(s.trace)
    await assert_store_roundtrip([s.trace], tmp_path / "run")


# -- item 2: every malformed input gets a 4xx ----------------------------------------------

@pytest.mark.parametrize("endpoint", list(PATHS))
async def test_deep_nesting_refused(proxy: Proxy, endpoint: str) -> None:
    body = orjson.dumps(OK[endpoint])[:-1] + b',"metadata":' + _deep(100_000) + b"}"
    await _refused(proxy, endpoint, body)


@pytest.mark.parametrize("endpoint", list(PATHS))
async def test_deep_but_parseable_nesting_refused(proxy: Proxy, endpoint: str) -> None:
    # Deeper than the encoders allow (orjson writes at most 254 levels), shallower than
    # the parsers refuse.
    body = orjson.dumps(OK[endpoint])[:-1] + b',"temperature":' + _deep(600) + b"}"
    await _refused(proxy, endpoint, body)


@pytest.mark.parametrize("endpoint", list(PATHS))
async def test_invalid_utf8_in_top_level_string(proxy: Proxy, endpoint: str) -> None:
    body = orjson.dumps(OK[endpoint]).replace(b'"model":"m"', b'"model":"\xff"')
    assert b"\xff" in body
    await _refused(proxy, endpoint, body)


@pytest.mark.parametrize("endpoint", list(PATHS))
async def test_invalid_utf8_in_message(proxy: Proxy, endpoint: str) -> None:
    body = orjson.dumps(OK[endpoint]).replace(b'"hi"', b'"h\xffi"')
    assert b"\xff" in body
    await _refused(proxy, endpoint, body)


@pytest.mark.parametrize("endpoint", list(PATHS))
async def test_gzip_header_with_plain_body(proxy: Proxy, endpoint: str) -> None:
    await _refused(proxy, endpoint, orjson.dumps(OK[endpoint]),
                   headers={"Content-Encoding": "gzip"})


async def test_gzip_body_is_accepted(proxy: Proxy) -> None:
    s = proxy.create_session()
    got, d = await _post(proxy, s, "chat", gzip.compress(orjson.dumps(OK["chat"])),
                         headers={"Content-Encoding": "gzip"})
    assert got == 200, d


@pytest.mark.parametrize("routed", [False, True])
async def test_non_utf8_secret_is_401(proxy: Proxy, routed: bool) -> None:
    s = proxy.create_session()
    body = orjson.dumps(OK["chat"])
    path = f"/sessions/{s.id}/v1/chat/completions" if routed else "/v1/chat/completions"
    host, port = proxy.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\n"
                 b"Authorization: Bearer tw-\xff\xfe\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n"
                 b"Connection: close\r\n\r\n" + body)
    await writer.drain()
    head = await reader.read(-1)
    writer.close()
    assert head.startswith(b"HTTP/1.1 401"), head[:200]
    got, d = await _post(proxy, s, "chat", OK["chat"])
    assert got == 200, d


ANTHROPIC_BAD: list[dict[str, Any]] = [
    {"tools": ["t"]},
    {"tools": 5},
    {"tools": [{"name": 5, "input_schema": {"type": "object"}}]},
    {"tools": [{"name": "t", "input_schema": "x"}]},
    {"system": 5},
    {"system": [5]},
    {"stop_sequences": "x"},
    {"stop_sequences": [1]},
    {"tool_choice": "auto"},
    {"messages": [{"role": "user", "content": [{"type": "image", "source": "abc"}]}]},
    {"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": 5}}]}]},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": None}]}]},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
    {"messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": 123, "content": "x"}]}]},
    {"messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t", "content": 5}]}]},
    {"messages": [{"role": "assistant", "content": [
        {"type": "tool_use", "id": 5, "name": "f", "input": {}}]}]},
    {"messages": [{"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "f", "input": "x"}]}]},
    {"messages": [{"role": "assistant", "content": [5]}]},
    {"messages": [{"role": "robot", "content": "x"}]},
    {"messages": [{"role": "user", "content": None}]},
    {"max_tokens": "20"},
    {"model": 5},
]


@pytest.mark.parametrize("patch", ANTHROPIC_BAD, ids=range(len(ANTHROPIC_BAD)))
async def test_anthropic_malformed(proxy: Proxy, patch: dict[str, Any]) -> None:
    await _refused(proxy, "messages", {**OK["messages"], **patch})


RESPONSES_BAD: list[dict[str, Any]] = [
    {"tools": 5},
    {"tools": ["x"]},
    {"tools": [{"type": "function", "name": 5}]},
    {"tools": [{"type": "function", "name": "f", "parameters": "x"}]},
    {"instructions": {"a": 1}},
    {"input": [{"type": "function_call_output", "call_id": 5, "output": "x"}]},
    {"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}]},
    {"input": [{"type": "message", "role": "user", "content": [{"type": "input_text"}]}]},
    {"input": [{"type": "message", "role": "user", "content": [5]}]},
    {"input": [{"type": 5}]},
    {"input": 5},
    {"tool_choice": 5},
    {"model": 5},
    {"max_output_tokens": "x"},
]


@pytest.mark.parametrize("patch", RESPONSES_BAD, ids=range(len(RESPONSES_BAD)))
async def test_responses_malformed(proxy: Proxy, patch: dict[str, Any]) -> None:
    await _refused(proxy, "responses", {**OK["responses"], **patch})


@pytest.mark.parametrize("endpoint", list(PATHS))
async def test_not_an_object(proxy: Proxy, endpoint: str) -> None:
    for body in (b"[]", b"5", b'"x"', b"null", b"", b"{", b'{"a":1}x'):
        await _refused(proxy, endpoint, body)


# -- item 4: Claude Code's system message inside ``messages`` ------------------------------

@pytest.mark.parametrize("stream", [False, True])
async def test_anthropic_system_role_in_messages(fake: Fake, proxy: Proxy, stream: bool,
                                                 tmp_path: Path) -> None:
    s = proxy.create_session()
    client = anthropic.AsyncAnthropic(base_url=s.anthropic_base_url, api_key=s.secret,
                                      max_retries=0)
    messages: list[Any] = [
        {"role": "system", "content": "you are claude code"},
        {"role": "user", "content": "hi"},
        {"role": "system", "content": [{"type": "text", "text": "remember: "},
                                       {"type": "text", "text": "be brief"}]},
    ]
    kw: dict[str, Any] = {"model": "m", "max_tokens": 20, "system": "top", "messages": messages}
    if stream:
        async with client.messages.stream(**kw) as st:
            m = await st.get_final_message()
    else:
        m = await client.messages.create(**kw)
    await client.close()
    assert m.content[0].type == "text"
    sent = fake.requests[-1]["messages"]
    assert [(x["role"], x["content"]) for x in sent] == [
        ("system", "top"), ("system", "you are claude code"), ("user", "hi"),
        ("system", "remember: be brief")]
    assert [n.message.role for n in s.trace.nodes] == [
        "system", "system", "user", "system", "assistant"]
    assert_codec_roundtrip(s.trace)
    await assert_store_roundtrip([s.trace], tmp_path / "run")
