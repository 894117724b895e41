"""Seeded mutation fuzz of harness requests against a real proxy and a loopback upstream.

For each dialect, streamed and not, valid multi-turn conversations are sent as growing
histories (so the known-prefix fast paths run too), most of them mutated: values replaced
by other types or by pieces of the body, keys dropped, items duplicated, raw JSON spliced
in (huge numbers, lone surrogates, invalid UTF-8, deep nesting), bytes flipped or cut,
odd headers. The proxy must answer every one below 500, keep serving, and every session's
trace must round-trip through the codec and a store.
"""

from __future__ import annotations

import asyncio
import copy
import gzip
import os
import random
import zlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from tracewire.proxy import Proxy, ProxyConfig
from tracewire.trace import Episode, Trace

from .fake_upstream import END, Fake, Turn, assistant_body, encode, logprob
from .readable import assert_codec_roundtrip

#: Requests per (dialect, streamed) case, four per session, three in four mutated; set
#: TRACEWIRE_FUZZ_REQUESTS (and TRACEWIRE_FUZZ_SEED) for a longer hunt.
REQUESTS = int(os.environ.get("TRACEWIRE_FUZZ_REQUESTS", "1000"))
SEED = os.environ.get("TRACEWIRE_FUZZ_SEED", "17")

PATHS = {"chat": "/v1/chat/completions", "messages": "/v1/messages",
         "responses": "/v1/responses"}
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}
IMAGE = "data:image/png;base64,AAAA"

CHAT = {"model": "m", "temperature": 0.5, "max_tokens": 30, "tools": [
    {"type": "function", "function": {"name": "add", "description": "adds",
                                      "parameters": SCHEMA}}], "messages": [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": [{"type": "text", "text": "look"},
                                 {"type": "image_url", "image_url": {"url": IMAGE}}]},
    {"role": "assistant", "content": "calling", "tool_calls": [
        {"id": "call_0", "type": "function", "function": {"name": "add",
                                                          "arguments": '{"a":0}'}}]},
    {"role": "tool", "tool_call_id": "call_0", "content": "42"},
    {"role": "assistant", "content": "done"},
    {"role": "user", "name": "bob", "content": "again"}]}
ANTHROPIC = {"model": "m", "max_tokens": 30, "system": [{"type": "text", "text": "be brief"}],
             "temperature": 0.5, "stop_sequences": ["\n\n"],
             "tool_choice": {"type": "auto"},
             "tools": [{"name": "add", "description": "adds", "input_schema": SCHEMA}],
             "messages": [
    {"role": "system", "content": "more system"},
    {"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": "AAAA"}}]},
    {"role": "assistant", "content": [{"type": "text", "text": "calling"}, {
        "type": "tool_use", "id": "call_0", "name": "add", "input": {"a": 0}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_0",
                                  "content": [{"type": "text", "text": "42"}]}]},
    {"role": "assistant", "content": "done"},
    {"role": "user", "content": "again"}]}
RESPONSES = {"model": "m", "instructions": "be brief", "max_output_tokens": 30,
             "temperature": 0.5, "tool_choice": "auto",
             "tools": [{"type": "function", "name": "add", "parameters": SCHEMA},
                       {"type": "web_search"}],
             "input": [
    {"role": "developer", "content": "more system"},
    {"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "look"}, {"type": "input_image", "image_url": IMAGE}]},
    {"type": "message", "role": "assistant", "content": [
        {"type": "output_text", "text": "calling"}]},
    {"type": "function_call", "call_id": "call_0", "name": "add", "arguments": '{"a":0}'},
    {"type": "function_call_output", "call_id": "call_0", "output": "42"},
    {"type": "reasoning", "summary": []},
    {"role": "user", "content": "again"}]}
BASES: dict[str, tuple[dict[str, Any], str]] = {
    "chat": (CHAT, "messages"), "messages": (ANTHROPIC, "messages"),
    "responses": (RESPONSES, "input")}

_MARK = "\x00tracewire-fuzz-raw\x00"
RAW = [b"1e999", b"123456789012345678901234567890", b'"\\ud800"', b'"\xff"', b'"a\xc3"',
       b"[" * 3000 + b"]" * 3000, b'{"a":' * 300 + b"1" + b"}" * 300, b"-0", b"1.5e-400",
       b'"\\u0000"', b"[" * 70 + b"]" * 70]
ATOMS: list[Any] = [
    None, True, False, 0, -7, 3.5, 2**63 - 1, -(2**63), "", "x", "é" * 3, "\u2028",
    "user", "assistant", "system", "tool", "developer", "text", "image", "tool_use",
    "tool_result", "function_call", "function_call_output", "message", "input_text",
    "base64", "url", "auto", [], {}, [1], {"type": "text"}, {"type": "text", "text": 5},
    {"type": "image", "source": "abc"}, ["t"],
]


def _slots(obj: Any) -> list[tuple[Any, Any]]:
    """Every (container, key) in ``obj``."""
    out: list[tuple[Any, Any]] = []
    stack = [obj]
    while stack:
        x = stack.pop()
        items = x.items() if isinstance(x, dict) else enumerate(x) if isinstance(
            x, list) else ()
        for k, v in items:
            out.append((x, k))
            stack.append(v)
    return out


def mutate(rng: random.Random, body: dict[str, Any]) -> bytes:
    """One mutated request body."""
    obj = copy.deepcopy(body)
    raws: list[bytes] = []
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        slots = _slots(obj)
        if not slots:
            break
        box, key = rng.choice(slots)
        op = rng.random()
        if op < 0.35:
            box[key] = copy.deepcopy(rng.choice(ATOMS))
        elif op < 0.55:  # another piece of the body, in the wrong place
            other, k2 = rng.choice(slots)
            box[key] = copy.deepcopy(other[k2])
        elif op < 0.7:
            del box[key]
        elif op < 0.8 and isinstance(box, list):
            box.insert(key, copy.deepcopy(box[key]))
        elif op < 0.9:
            box[key] = _MARK
            raws.append(rng.choice(RAW))
        else:
            box[key] = [box[key]] if rng.random() < 0.5 else {"x": box[key]}
    data = orjson.dumps(obj)
    for raw in raws:
        data = data.replace(orjson.dumps(_MARK), raw, 1)
    if rng.random() < 0.15:  # byte level
        b = bytearray(data)
        i = rng.randrange(len(b))
        r = rng.random()
        if r < 0.3:
            b[i] ^= 1 << rng.randrange(8)
        elif r < 0.5:
            b.insert(i, 0xFF)
        elif r < 0.7:
            del b[i:i + rng.randrange(1, 8)]
        else:
            b = b[:i]
        data = bytes(b)
    return data


class TolerantFake(Fake):
    """The fake upstream, answering any JSON a proxy forwards (a real server would refuse
    garbage with a 400; this one renders whatever it can, so accepted turns get tokens)."""

    def answer(self, req: dict[str, Any]) -> Turn:
        msgs = req["messages"]
        prompt = render(msgs)
        tools = req.get("tools")
        name = None
        if isinstance(tools, list) and tools and isinstance(tools[0], dict):
            fn = tools[0].get("function")
            if isinstance(fn, dict) and isinstance(fn.get("name"), str):
                name = fn["name"]
        n_tool = sum(1 for m in msgs if isinstance(m, dict) and m.get("role") == "tool")
        calls: list[tuple[str, str, str]] = []
        if name is not None and n_tool < 3:
            calls = [(f"call_{len(self.log)}", name, orjson.dumps({"a": n_tool}).decode())]
        content = None if calls and n_tool % 2 else f"ok {len(self.log)}"
        completion = assistant_body(content, [(n, a) for _, n, a in calls])
        turn = Turn(prompt, completion, [logprob(i, t) for i, t in enumerate(completion)],
                    content, calls)
        self.log.append(turn)
        return turn

    async def chat(self, request: web.Request) -> web.StreamResponse:
        try:
            req = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            req = None
        if not isinstance(req, dict) or not isinstance(req.get("messages"), list) or (
                not isinstance(req.get("stream_options") or {}, dict)):
            return web.json_response({"error": {"message": "bad request"}}, status=400)
        return await super().chat(request)


def _text(v: Any) -> str:
    if isinstance(v, str):
        return v
    try:
        return orjson.dumps(v, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:
        return "?"


def render(msgs: list[Any]) -> list[int]:
    """Like the fake's template, for any JSON: role id from the role, then the text."""
    ids: list[int] = []
    for m in msgs:
        if not isinstance(m, dict):
            ids.append(3)
            continue
        role = m.get("role")
        ids.append(10 + zlib.crc32(_text(role).encode()) % 50)
        if role == "assistant":
            calls = []
            for tc in m.get("tool_calls") or ():
                fn = tc.get("function") if isinstance(tc, dict) else None
                fn = fn if isinstance(fn, dict) else {}
                calls.append((_text(fn.get("name")), _text(fn.get("arguments"))))
            content = m.get("content")
            ids += assistant_body(content if isinstance(content, str) else None, calls)
        else:
            content = m.get("content")
            text = content if isinstance(content, str) else "".join(
                _text(p.get("text", "")) for p in content
                if isinstance(p, dict) and p.get("type") == "text"
            ) if isinstance(content, list) else _text(content)
            ids += [*encode(text), END]
    return [*ids, 12]


@pytest.fixture
async def tolerant() -> AsyncIterator[tuple[TolerantFake, Proxy]]:
    fake = TolerantFake()
    runner = web.AppRunner(fake.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    async with Proxy(url, config=ProxyConfig(keepalive_s=5.0)) as p:
        yield fake, p
    await runner.cleanup()


def _history(body: dict[str, Any], key: str, n: int) -> dict[str, Any]:
    return {**body, key: body[key][:n]}


async def _send(c: aiohttp.ClientSession, url: str, secret: str, data: bytes,
                rng: random.Random) -> int:
    headers = {"Authorization": f"Bearer {secret}", "Content-Type": "application/json"}
    r = rng.random()
    if r < 0.03:
        headers["Content-Encoding"] = "gzip"  # and the body is not
    elif r < 0.06:
        headers["Content-Encoding"] = "gzip"
        data = gzip.compress(data)
    elif r < 0.08:
        headers["Content-Type"] = "text/plain"
    async with c.post(url, data=data, headers=headers) as resp:
        await resp.read()
        return resp.status


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
@pytest.mark.parametrize("endpoint", list(PATHS))
async def test_fuzz_no_5xx_and_every_trace_readable(
        tolerant: tuple[TolerantFake, Proxy], endpoint: str, stream: bool, tmp_path: Path
) -> None:
    _fake, proxy = tolerant
    rng = random.Random(f"{SEED}-{endpoint}-{stream}")
    base, key = BASES[endpoint]
    base = {**base, "stream": stream}
    url = proxy.url + PATHS[endpoint]
    statuses: dict[int, int] = {}
    traces: list[Trace] = []
    n = len(base[key])
    async with aiohttp.ClientSession(auto_decompress=False) as c:

        async def session() -> None:
            s = proxy.create_session()
            traces.append(s.trace)
            for turn in range(4):  # a growing history, as harnesses send it
                body = _history(base, key, max(1, n - 3 + turn))
                data = mutate(rng, body) if rng.random() < 0.75 else orjson.dumps(body)
                status = await _send(c, url, s.secret, data, rng)
                statuses[status] = statuses.get(status, 0) + 1
                assert status < 500, (status, data[:500])

        for _ in range(REQUESTS // 4 // 8):
            await asyncio.gather(*(session() for _ in range(8)))
        # Still serving.
        s = proxy.create_session()
        ok = await _send(c, url, s.secret, orjson.dumps(base), random.Random(1))
        assert ok == 200
    await asyncio.sleep(0.05)  # unary turns commit on the loop pass after the answer
    assert statuses.get(200, 0) > REQUESTS // 4, statuses  # the fuzz records real turns
    assert sum(v for k, v in statuses.items() if 400 <= k < 500) > REQUESTS // 10, statuses
    recorded = [t for t in traces if t.calls]
    assert len(recorded) > len(traces) // 2
    refused = 0
    for t in traces:
        for c in t.calls:
            # A failed call is a request the proxy refused (recorded with its reason, so a
            # run shows why an agent stopped) or the upstream refusing what it was sent;
            # either way it holds no completion.
            if c.error is not None:
                assert c.node is None and c.error, c
                refused += c.error != "bad request"
        assert_codec_roundtrip(t)
    assert refused > 0  # refused requests are on the traces, not only in the statuses
    await _store_all(traces, tmp_path / "run")


async def _store_all(traces: list[Trace], path: Path) -> None:
    from tracewire.store import Run, open_run

    run = await Run.create(path, fsync="never")
    eps = [Episode(traces=traces[i:i + 25]) for i in range(0, len(traces), 25)]
    for ep in eps:
        await run.append(ep)
    await run.close()
    with open_run(path) as r:
        for ep in eps:
            got = r.get(ep.id)
            assert [t.nodes for t in got.traces] == [t.nodes for t in ep.traces]
            assert [t.calls for t in got.traces] == [t.calls for t in ep.traces]
