"""Official SDKs through the proxy against the built-in model: token-exact traces and the
same content the harness would get from the model directly."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import anthropic
import numpy as np
import openai
import orjson
import pytest

from tracewire.model import MODEL_NAME, ModelServer
from tracewire.proxy import Proxy, ProxyConfig

from .helpers import ANTHROPIC_TOOLS, TOOLS

TURNS = 6


def _force(turn: int) -> dict[str, Any]:
    if turn >= TURNS - 1:
        return {}
    return {"tracewire": {"force": {"text": f"step {turn}", "tool_calls": [
        {"name": "add", "arguments": orjson.dumps({"a": turn}).decode()}]}}}


@pytest.fixture
async def model() -> AsyncIterator[ModelServer]:
    async with ModelServer() as m:
        yield m


@pytest.fixture
async def recorded(model: ModelServer) -> AsyncIterator[tuple[Proxy, list[dict[str, Any]]]]:
    sent: list[dict[str, Any]] = []

    def record(session: Any, endpoint: str, body: dict[str, Any]) -> None:
        sent.append(orjson.loads(orjson.dumps(body)))

    async with Proxy(model.base_url, config=ProxyConfig(request_hooks=[record])) as p:
        yield p, sent


async def _direct(model: ModelServer, body: dict[str, Any], tokens: bool) -> dict[str, Any]:
    body = {**body, "stream": False}
    body.pop("stream_options", None)
    if tokens:
        body |= {"return_token_ids": True, "logprobs": True}
    async with aiohttp.ClientSession() as c, c.post(model.base_url + "/chat/completions",
                                                    json=body) as r:
        assert r.status == 200, await r.text()
        return dict(await r.json())


async def _check_trace(model: ModelServer, proxy: Proxy, sent: list[dict[str, Any]],
                       trace: Any) -> list[dict[str, Any]]:
    """Replays every upstream request directly; returns the direct (token-free) answers."""
    assert len(sent) == TURNS and len(trace.calls) == TURNS
    assert all(c.error is None for c in trace.calls)
    want_ids: list[int] = []
    want_mask: list[int] = []
    want_lp: list[float] = []
    direct = []
    for body in sent:
        d = await _direct(model, body, tokens=True)
        prompt, ch = d["prompt_token_ids"], d["choices"][0]
        assert prompt[: len(want_ids)] == want_ids  # the model's template is consistent
        new = prompt[len(want_ids):]
        want_ids += new + ch["token_ids"]
        want_mask += [0] * len(new) + [1] * len(ch["token_ids"])
        want_lp += [np.nan] * len(new) + [e["logprob"] for e in ch["logprobs"]["content"]]
        direct.append(await _direct(model, body, tokens=False))
    br = trace.branch(trace.calls[-1].node)
    assert br.ids.tolist() == want_ids
    assert br.mask.tolist() == want_mask
    np.testing.assert_array_equal(br.logprobs, np.array(want_lp, dtype=np.float32))
    assert trace.info.get("token_mismatches", 0) == 0
    assert [c.finish_reason for c in trace.calls[:-1]] == ["tool_calls"] * (TURNS - 1)
    return direct


def _same(got: dict[str, Any], want: dict[str, Any]) -> None:
    for d in (got, want):
        d.pop("id", None)
        d.pop("created", None)
    assert got == want


@pytest.mark.parametrize("stream", [False, True])
async def test_openai_chat(model: ModelServer, recorded: Any, stream: bool) -> None:
    proxy, sent = recorded
    s = proxy.create_session()
    client = openai.AsyncOpenAI(base_url=s.base_url, api_key=s.secret, max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "add things up"}]
    got: list[Any] = []
    for turn in range(TURNS):
        kw: dict[str, Any] = {"model": MODEL_NAME, "messages": messages, "tools": TOOLS,
                              "temperature": 0, "max_tokens": 24, "extra_body": _force(turn)}
        if stream:
            text, calls, chunks = "", {}, []
            async for chunk in await client.chat.completions.create(stream=True, **kw):
                chunks.append(chunk)
                for ch in chunk.choices:
                    text += ch.delta.content or ""
                    for tc in ch.delta.tool_calls or ():
                        slot = calls.setdefault(tc.index, {"id": "", "name": "", "args": ""})
                        slot["id"] = tc.id or slot["id"]
                        slot["name"] += (tc.function.name or "") if tc.function else ""
                        slot["args"] += (tc.function.arguments or "") if tc.function else ""
            assert not any(getattr(c, "prompt_token_ids", None) for c in chunks)
            msg: dict[str, Any] = {"role": "assistant", "content": text or None}
            if calls:
                msg["tool_calls"] = [{"id": c["id"], "type": "function", "function": {
                    "name": c["name"], "arguments": c["args"]}} for c in calls.values()]
            got.append(msg)
        else:
            raw = await client.chat.completions.with_raw_response.create(**kw)
            d = orjson.loads(raw.content)
            got.append(d)
            msg = d["choices"][0]["message"]
            msg = {k: v for k, v in msg.items() if v is not None}
        messages.append(msg)
        for tc in msg.get("tool_calls") or ():
            messages.append({"role": "tool", "tool_call_id": tc["id"], "content": "7"})
        if not msg.get("tool_calls"):
            messages.append({"role": "user", "content": "thanks"})
    await client.close()
    direct = await _check_trace(model, proxy, sent, s.trace)
    for g, d in zip(got, direct, strict=True):
        if stream:
            dm = d["choices"][0]["message"]
            assert g["content"] == dm["content"]
            assert [(t["function"]["name"], t["function"]["arguments"])
                    for t in g.get("tool_calls") or ()] == [
                (t["function"]["name"], t["function"]["arguments"])
                for t in dm.get("tool_calls") or ()]
        else:
            for x in (g, d):  # tool call ids are random per call
                for t in x["choices"][0]["message"].get("tool_calls") or ():
                    t.pop("id")
            _same(g, d)


@pytest.mark.parametrize("stream", [False, True])
async def test_anthropic_messages(model: ModelServer, recorded: Any, stream: bool) -> None:
    proxy, sent = recorded
    s = proxy.create_session()
    client = anthropic.AsyncAnthropic(base_url=s.anthropic_base_url, api_key=s.secret,
                                      max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "add things up"}]
    got = []
    for turn in range(TURNS):
        kw: dict[str, Any] = {"model": MODEL_NAME, "max_tokens": 24, "messages": messages,
                              "tools": ANTHROPIC_TOOLS,
                              "extra_body": {"temperature": 0, **_force(turn)}}
        if stream:
            async with client.messages.stream(**kw) as st:
                m = await st.get_final_message()
        else:
            m = await client.messages.create(**kw)
        blocks = [b.model_dump(exclude_none=True) for b in m.content]
        blocks = [{k: v for k, v in b.items() if k != "citations"} for b in blocks]
        got.append(blocks)
        messages.append({"role": "assistant", "content": blocks})
        uses = [b for b in blocks if b["type"] == "tool_use"]
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": b["id"], "content": "7"} for b in uses]
            if uses else "thanks"})
    await client.close()
    direct = await _check_trace(model, proxy, sent, s.trace)
    for blocks, d in zip(got, direct, strict=True):
        dm = d["choices"][0]["message"]
        assert "".join(b["text"] for b in blocks if b["type"] == "text") == (dm["content"] or "")
        assert [(b["name"], b["input"]) for b in blocks if b["type"] == "tool_use"] == [
            (t["function"]["name"], orjson.loads(t["function"]["arguments"]))
            for t in dm.get("tool_calls") or ()]


@pytest.mark.parametrize("stream", [False, True])
async def test_openai_responses(model: ModelServer, recorded: Any, stream: bool) -> None:
    proxy, sent = recorded
    s = proxy.create_session()
    client = openai.AsyncOpenAI(base_url=s.base_url, api_key=s.secret, max_retries=0)
    tools = [{"type": "function", "name": "add", "parameters": TOOLS[0]["function"]["parameters"]}]
    items: list[dict[str, Any]] = [{"role": "user", "content": "add things up"}]
    got = []
    for turn in range(TURNS):
        kw: dict[str, Any] = {"model": MODEL_NAME, "input": items, "tools": tools,
                              "temperature": 0, "max_output_tokens": 24,
                              "extra_body": _force(turn)}
        if stream:
            final = None
            async for ev in await client.responses.create(stream=True, **kw):
                if ev.type in ("response.completed", "response.incomplete"):
                    final = ev.response
            assert final is not None
            r = final
        else:
            r = await client.responses.create(**kw)
        out = [o.model_dump(exclude_none=True) for o in r.output]
        got.append(out)
        items += out
        calls = [o for o in out if o["type"] == "function_call"]
        items += [{"type": "function_call_output", "call_id": c["call_id"], "output": "7"}
                  for c in calls] or [{"role": "user", "content": "thanks"}]
    await client.close()
    direct = await _check_trace(model, proxy, sent, s.trace)
    for out, d in zip(got, direct, strict=True):
        dm = d["choices"][0]["message"]
        text = "".join(c["text"] for o in out if o["type"] == "message" for c in o["content"])
        assert text == (dm["content"] or "")
        assert [(o["name"], o["arguments"]) for o in out if o["type"] == "function_call"] == [
            (t["function"]["name"], t["function"]["arguments"])
            for t in dm.get("tool_calls") or ()]
