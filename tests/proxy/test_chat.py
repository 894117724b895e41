"""OpenAI chat completions through the proxy against the fake vLLM/SGLang upstream."""

from __future__ import annotations

import openai
import orjson
import pytest

from tracewire.proxy import Proxy

from .fake_upstream import Fake
from .helpers import check_linear, openai_chat_loop


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("mode", ["vllm", "sglang"])
async def test_tool_loop_token_exact(fake: Fake, proxy: Proxy, stream: bool, mode: str) -> None:
    fake.mode = mode
    s = proxy.create_session()
    client = openai.AsyncOpenAI(base_url=s.base_url, api_key=s.secret, max_retries=0)
    seen = await openai_chat_loop(client, turns=6, stream=stream)
    await client.close()
    log = fake.log
    check_linear(s.trace, [t.prompt for t in log], [t.completion for t in log],
                 [t.logprobs for t in log])
    for msg, turn in zip(seen, log, strict=True):
        assert msg.get("content") == turn.content
        got = [(c["id"], c["function"]["name"], c["function"]["arguments"])
               for c in msg.get("tool_calls") or ()]
        assert got == turn.calls
    # One node per message: system, user, then (assistant, tool|user) per turn.
    assert len(s.trace.nodes) == 2 + 6 + 5
    assert [c.finish_reason for c in s.trace.calls][:5] == ["tool_calls"] * 5
    assert s.trace.calls[-1].endpoint == "chat"


async def test_token_fields_stripped_unless_asked(fake: Fake, proxy: Proxy) -> None:
    s = proxy.create_session()
    client = openai.AsyncOpenAI(base_url=s.base_url, api_key=s.secret, max_retries=0)
    msgs = [{"role": "user", "content": "hi"}]
    raw = await client.chat.completions.with_raw_response.create(model="m", messages=msgs)
    d = orjson.loads(raw.content)
    assert "prompt_token_ids" not in d
    assert "token_ids" not in d["choices"][0]
    assert d["choices"][0]["logprobs"] is None
    raw = await client.chat.completions.with_raw_response.create(
        model="m", messages=msgs, logprobs=True, extra_body={"return_token_ids": True})
    d = orjson.loads(raw.content)
    assert d["prompt_token_ids"] == fake.log[-1].prompt
    assert d["choices"][0]["token_ids"] == fake.log[-1].completion
    await client.close()


async def test_no_token_ids_recorded_honestly(fake: Fake, proxy: Proxy) -> None:
    fake.mode = "none"
    s = proxy.create_session()
    client = openai.AsyncOpenAI(base_url=s.base_url, api_key=s.secret, max_retries=0)
    await openai_chat_loop(client, turns=3, stream=False)
    await client.close()
    t = s.trace
    assert len(t.calls) == 3 and len(t.columns) == 0
    assert all(not n.has_tokens for n in t.nodes)
    assert len(t.nodes) == 2 + 3 + 2
