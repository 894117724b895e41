"""Mismatch 0 through every dialect the proxy speaks, under trained (non-zero) weights.

The bundled envs' harnesses all speak chat completions; agents also use the Anthropic
Messages and OpenAI Responses APIs, which the proxy translates to the upstream's chat
completions. Each conversation here is two turns through a real proxy session with the
real SDK; its samples (the session payload) are rescored from token ids alone.
"""

from __future__ import annotations

from typing import Any

import anthropic
import numpy as np
import openai
import pytest

from tracewire.model import MODEL_NAME, ChatTemplate, ModelServer, Policy, get_engine, rescore
from tracewire.proxy import Proxy
from tracewire.samples import assemble, decode_samples, encode_samples
from tracewire.trace import Trace

SYSTEM = "Answer with one word."
QUESTIONS = ["What is the capital of Norway?", "What is the opposite of hot?"]


async def _chat(session: Any) -> None:
    client = openai.AsyncOpenAI(base_url=session.base_url, api_key=session.secret,
                                max_retries=0)
    msgs: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    for q in QUESTIONS:
        msgs.append({"role": "user", "content": q})
        r = await client.chat.completions.create(model=MODEL_NAME, messages=msgs, seed=3,  # type: ignore[arg-type]
                                                 max_tokens=24)
        msgs.append({"role": "assistant", "content": r.choices[0].message.content or ""})
    await client.close()


async def _anthropic(session: Any) -> None:
    client = anthropic.AsyncAnthropic(base_url=session.anthropic_base_url,
                                      api_key=session.secret, max_retries=0)
    msgs: list[dict[str, Any]] = []
    for q in QUESTIONS:
        msgs.append({"role": "user", "content": q})
        r = await client.messages.create(model=MODEL_NAME, system=SYSTEM, messages=msgs,  # type: ignore[arg-type]
                                         max_tokens=24)
        text = "".join(b.text for b in r.content if b.type == "text")
        msgs.append({"role": "assistant", "content": text})
    await client.close()


async def _responses(session: Any) -> None:
    client = openai.AsyncOpenAI(base_url=session.base_url, api_key=session.secret,
                                max_retries=0)
    items: list[dict[str, Any]] = []
    for q in QUESTIONS:
        items.append({"role": "user", "content": q})
        r = await client.responses.create(model=MODEL_NAME, instructions=SYSTEM, input=items,  # type: ignore[arg-type]
                                          max_output_tokens=24)
        items.append({"role": "assistant", "content": r.output_text})
    await client.close()


@pytest.mark.parametrize("talk", [_chat, _anthropic, _responses], ids=["chat", "anthropic",
                                                                      "responses"])
async def test_rescored_samples_match_recorded_logprobs(talk: Any) -> None:
    e = get_engine()
    tpl = ChatTemplate(e.tok)
    rng = np.random.default_rng(0)
    v = e.tok.vocab_size
    policy = Policy.zeros(v).updated(rng.normal(0, 0.5, v), rng.normal(0, 0.5, (v, v)), 1)
    async with ModelServer() as server:
        server.set_policy(policy)
        async with Proxy(server.url_for(1)) as proxy:
            trace = Trace()
            session = proxy.create_session(trace=trace)
            await talk(session)
    samples = decode_samples(encode_samples(assemble(trace, metadata={"policy_version": 1})))
    scored = 0
    for s in samples:
        assert s.logprobs is not None and s.metadata["policy_version"] == 1
        r = rescore(e, tpl, s.tokens, s.loss_mask, s.prompt_len, policy)
        rec = s.logprobs[r.positions]
        assert r.logprobs.astype(np.float32).tolist() == rec.tolist()
        scored += r.positions.size
    assert scored > 0
