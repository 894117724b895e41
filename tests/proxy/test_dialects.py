"""Anthropic Messages and OpenAI Responses through the proxy (translated upstream)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anthropic
import openai
import orjson
import pytest

from tracewire.proxy import Proxy, ProxyConfig

from .fake_upstream import Fake
from .helpers import ANTHROPIC_TOOLS, TOOLS, anthropic_loop, check_linear


@pytest.mark.parametrize("stream", [False, True])
async def test_anthropic_tool_loop(fake: Fake, proxy: Proxy, stream: bool) -> None:
    s = proxy.create_session()
    client = anthropic.AsyncAnthropic(base_url=s.anthropic_base_url, api_key=s.secret,
                                      max_retries=0)
    seen = await anthropic_loop(client, turns=6, stream=stream)
    await client.close()
    log = fake.log
    check_linear(s.trace, [t.prompt for t in log], [t.completion for t in log],
                 [t.logprobs for t in log])
    for blocks, turn in zip(seen, log, strict=True):
        texts = "".join(b["text"] for b in blocks if b["type"] == "text")
        assert texts == (turn.content or "")
        uses = [(b["id"], b["name"], b["input"]) for b in blocks if b["type"] == "tool_use"]
        assert uses == [(i, n, orjson.loads(a)) for i, n, a in turn.calls]
    assert s.trace.calls[0].endpoint == "messages"
    # tools were translated to chat tools upstream
    assert fake.requests[0]["tools"][0]["function"]["name"] == "add"


async def test_anthropic_count_tokens_falls_back(fake: Fake, proxy: Proxy) -> None:
    s = proxy.create_session()
    client = anthropic.AsyncAnthropic(base_url=s.anthropic_base_url, api_key=s.secret,
                                      max_retries=0)
    r = await client.messages.count_tokens(model="m", messages=[{"role": "user",
                                                                 "content": "hi"}])
    await client.close()
    assert r.input_tokens == len(fake.log[-1].prompt)
    assert len(s.trace.calls) == 0


async def _responses_loop(client: openai.AsyncOpenAI, turns: int, stream: bool
                          ) -> list[list[dict[str, Any]]]:
    tools = [{"type": "function", "name": "add", "parameters": TOOLS[0]["function"]["parameters"]}]
    items: list[dict[str, Any]] = [{"role": "user", "content": "add things"}]
    seen = []
    for _ in range(turns):
        if stream:
            final = None
            async for ev in await client.responses.create(
                    model="m", input=items, tools=tools, instructions="be brief",  # type: ignore[arg-type]
                    stream=True):
                if ev.type == "response.completed":
                    final = ev.response
            assert final is not None
            out = [o.model_dump(exclude_none=True) for o in final.output]
        else:
            r = await client.responses.create(model="m", input=items, tools=tools,  # type: ignore[arg-type]
                                              instructions="be brief")
            out = [o.model_dump(exclude_none=True) for o in r.output]
        seen.append(out)
        calls = [o for o in out if o["type"] == "function_call"]
        items += out
        if calls:
            items += [{"type": "function_call_output", "call_id": c["call_id"], "output": "42"}
                      for c in calls]
        else:
            items.append({"role": "user", "content": "and again"})
    return seen


@pytest.mark.parametrize("stream", [False, True])
async def test_responses_tool_loop(fake: Fake, proxy: Proxy, stream: bool) -> None:
    s = proxy.create_session()
    client = openai.AsyncOpenAI(base_url=s.base_url, api_key=s.secret, max_retries=0)
    seen = await _responses_loop(client, 6, stream)
    await client.close()
    log = fake.log
    check_linear(s.trace, [t.prompt for t in log], [t.completion for t in log],
                 [t.logprobs for t in log])
    for out, turn in zip(seen, log, strict=True):
        text = "".join(c["text"] for o in out if o["type"] == "message" for c in o["content"])
        assert text == (turn.content or "")
        calls = [(o["call_id"], o["name"], o["arguments"]) for o in out
                 if o["type"] == "function_call"]
        assert calls == turn.calls
    assert s.trace.calls[0].endpoint == "responses"


# -- echoed tool calls keep the text the model sampled ------------------------------------

SPACED_TURNS = 4


def _args(turn: int) -> str:
    return '{"a": ' + str(turn) + ',  "b" : [1, 2]}'


def _spaced(turn: int) -> dict[str, Any]:
    """Force a tool call whose arguments text is not compact JSON (as models write it)."""
    if turn >= SPACED_TURNS - 1:
        return {}
    return {"tracewire": {"force": {"text": f"step {turn}", "tool_calls": [
        {"name": "add", "arguments": _args(turn)}]}}}


@pytest.fixture
async def builtin() -> AsyncIterator[tuple[Proxy, list[dict[str, Any]]]]:
    from tracewire.model import ModelServer

    sent: list[dict[str, Any]] = []

    def record(session: Any, endpoint: str, body: dict[str, Any]) -> None:
        sent.append(orjson.loads(orjson.dumps(body)))

    async with ModelServer() as m, Proxy(
            m.base_url, config=ProxyConfig(request_hooks=[record])) as p:
        yield p, sent


def _sent_args(sent: list[dict[str, Any]]) -> list[str]:
    return [tc["function"]["arguments"] for body in sent for msg in body["messages"]
            if msg["role"] == "assistant" for tc in msg.get("tool_calls") or ()]


@pytest.mark.parametrize("stream", [False, True])
async def test_anthropic_tool_loop_echoes_exact_arguments(
        builtin: tuple[Proxy, list[dict[str, Any]]], stream: bool) -> None:
    from tracewire.model import MODEL_NAME

    proxy, sent = builtin
    s = proxy.create_session()
    client = anthropic.AsyncAnthropic(base_url=s.anthropic_base_url, api_key=s.secret,
                                      max_retries=0)
    messages: list[Any] = [{"role": "system", "content": "you are an agent"},
                           {"role": "user", "content": "add things up"}]
    for turn in range(SPACED_TURNS):
        kw: dict[str, Any] = {"model": MODEL_NAME, "max_tokens": 64, "messages": messages,
                              "tools": ANTHROPIC_TOOLS,
                              "extra_body": {"temperature": 0, **_spaced(turn)}}
        if stream:
            async with client.messages.stream(**kw) as st:
                m = await st.get_final_message()
        else:
            m = await client.messages.create(**kw)
        blocks = [b.model_dump(exclude_none=True) for b in m.content]
        blocks = [{k: v for k, v in b.items() if k != "citations"} for b in blocks]
        messages.append({"role": "assistant", "content": blocks})
        uses = [b for b in blocks if b["type"] == "tool_use"]
        if turn < SPACED_TURNS - 1:
            assert uses and uses[0]["input"] == {"a": turn, "b": [1, 2]}
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": b["id"], "content": "7"} for b in uses]
            if uses else "thanks"})
    await client.close()
    t = s.trace
    assert len(t.calls) == SPACED_TURNS and all(c.error is None for c in t.calls)
    assert t.info.get("token_mismatches", 0) == 0
    # One linear branch: every prompt extended the previous prompt + completion.
    assert sum(1 for n in t.nodes if n.parent is None) == 1
    # What went upstream for the echoed calls is the text the model sampled.
    assert _sent_args(sent)[-(SPACED_TURNS - 1):] == [
        _args(i) for i in range(SPACED_TURNS - 1)]


@pytest.mark.parametrize(("reserialize", "stream"), [(False, False), (True, False),
                                                     (True, True)])
async def test_responses_tool_loop_echoes_exact_arguments(
        builtin: tuple[Proxy, list[dict[str, Any]]], reserialize: bool, stream: bool) -> None:
    from tracewire.model import MODEL_NAME

    proxy, sent = builtin
    s = proxy.create_session()
    client = openai.AsyncOpenAI(base_url=s.base_url, api_key=s.secret, max_retries=0)
    tools = [{"type": "function", "name": "add", "parameters": TOOLS[0]["function"]["parameters"]}]
    items: list[dict[str, Any]] = [{"role": "user", "content": "add things up"}]
    for turn in range(SPACED_TURNS):
        kw: dict[str, Any] = {
            "model": MODEL_NAME, "input": items, "tools": tools, "temperature": 0,
            "max_output_tokens": 64, "instructions": "you are an agent",
            "extra_body": _spaced(turn)}
        if stream:
            r = None
            async for ev in await client.responses.create(stream=True, **kw):
                if ev.type == "response.completed":
                    r = ev.response
            assert r is not None
        else:
            r = await client.responses.create(**kw)
        out = [o.model_dump(exclude_none=True) for o in r.output]
        if reserialize:  # harnesses that keep parsed arguments write them back compact
            for o in out:
                if o["type"] == "function_call":
                    o["arguments"] = orjson.dumps(orjson.loads(o["arguments"])).decode()
        items += out
        calls = [o for o in out if o["type"] == "function_call"]
        items += [{"type": "function_call_output", "call_id": c["call_id"], "output": "7"}
                  for c in calls] or [{"role": "user", "content": "thanks"}]
    await client.close()
    t = s.trace
    assert len(t.calls) == SPACED_TURNS and all(c.error is None for c in t.calls)
    assert t.info.get("token_mismatches", 0) == 0
    assert sum(1 for n in t.nodes if n.parent is None) == 1
    assert _sent_args(sent)[-(SPACED_TURNS - 1):] == [
        _args(i) for i in range(SPACED_TURNS - 1)]


def test_recorded_arguments_used_only_when_they_mean_the_echoed_call() -> None:
    from tracewire.proxy._anthropic import to_chat as anthropic_chat
    from tracewire.proxy._responses import to_chat as responses_chat

    recorded = {"c1": '{"a": 1,  "b": [1]}', "c2": "not json {", "c3": '{"a": 1}'}

    def via_anthropic(cid: str, inp: Any) -> str:
        body = {"messages": [{"role": "assistant", "content": [
            {"type": "tool_use", "id": cid, "name": "f", "input": inp}]}]}
        msg = anthropic_chat(body, recorded)["messages"][0]
        return str(msg["tool_calls"][0]["function"]["arguments"])

    assert via_anthropic("c1", {"b": [1], "a": 1}) == recorded["c1"]  # same value
    assert via_anthropic("c1", {"a": 2, "b": [1]}) == '{"a":2,"b":[1]}'  # the harness edited
    assert via_anthropic("c2", {"_raw": "not json {"}) == "not json {"  # shown as _raw
    assert via_anthropic("c3", {"a": True}) == '{"a":true}'  # true is not 1
    assert via_anthropic("zz", {"a": 1}) == '{"a":1}'  # unknown id: serialized

    def via_responses(cid: str, args: str) -> str:
        body = {"input": [{"type": "function_call", "call_id": cid, "name": "f",
                           "arguments": args}]}
        msg = responses_chat(body, recorded)["messages"][0]
        return str(msg["tool_calls"][0]["function"]["arguments"])

    assert via_responses("c1", '{"a":1,"b":[1]}') == recorded["c1"]
    assert via_responses("c1", '{"a":3}') == '{"a":3}'
    assert via_responses("c1", "garbage") == "garbage"
    assert via_responses("zz", '{"a":1}') == '{"a":1}'
