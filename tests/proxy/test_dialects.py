"""Anthropic Messages and OpenAI Responses through the proxy (translated upstream)."""

from __future__ import annotations

from typing import Any

import anthropic
import openai
import pytest

from tracewire.proxy import Proxy

from .fake_upstream import Fake
from .helpers import TOOLS, anthropic_loop, check_linear


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
        import orjson
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
