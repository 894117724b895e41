"""The session API over the real engine: an unmodified openai SDK multi-turn loop (streamed
and not) through a token-in/token-out proxy on llama-server — wired by the composition
root exactly as ``eval --engine llamacpp`` wires it (the GGUF as tokenizer, upstream api
``llamacpp``) — with the recording relay between the proxy and the server.

The trainer's view must be the wire's: the session summary reports mismatch 0, and the
samples the session API hands out decode to the ids sent and sampled, the loss mask on the
sampled ids, and their logprobs bit for bit.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import openai
import pytest

from tracewire.compose import make_upstream
from tracewire.proxy import Proxy, ProxyConfig
from tracewire.sessions import SessionClient

from .conftest import LlamaServerProc
from .relay import Relay
from .wire import Turn, check_against_wire, completion_turns, f32_bits

QUESTIONS = ["What is the capital of France?", "And of Italy?", "Which one is bigger?",
             "Say it in one word."]


async def _loop(base_url: str, key: str, stream: bool, seed: int) -> None:
    sdk = openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0)
    messages: list[dict[str, str]] = [{"role": "system", "content": "Answer briefly."}]
    try:
        for q in QUESTIONS:
            messages.append({"role": "user", "content": q})
            if stream:
                parts = []
                async for chunk in await sdk.chat.completions.create(
                        model="m", messages=messages, max_tokens=96, seed=seed,
                        temperature=0.9, stream=True):
                    if chunk.choices and chunk.choices[0].delta.content:
                        parts.append(chunk.choices[0].delta.content)
                text = "".join(parts)
            else:
                resp = await sdk.chat.completions.create(
                    model="m", messages=messages, max_tokens=96, seed=seed,
                    temperature=0.9)
                text = resp.choices[0].message.content or ""
            messages.append({"role": "assistant", "content": text})
    finally:
        await sdk.close()


def _answers(turns: list[Turn]) -> list[Turn]:
    """One turn per answer: a refused stream and its unstreamed rest joined into one."""
    out: list[Turn] = []
    for t in turns:
        if out and out[-1].refused:
            head = out.pop()
            kept = t.prompt[len(head.prompt):]
            t = Turn(head.prompt, kept + t.ids, head.logprobs[:len(kept)] + t.logprobs,
                     t.stop_type, True, head.request)
        out.append(t)
    return out


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
async def test_session_samples_are_the_wire(stream: bool, llama_server: LlamaServerProc,
                                            smollm_gguf: Path) -> None:
    async with Relay(llama_server.url) as relay:
        config = ProxyConfig()
        async with Proxy(make_upstream(relay.url + "/v1", config, model="smollm",
                                       tokenizer=str(smollm_gguf), upstream_api="llamacpp"),
                         config=config) as proxy, \
                SessionClient(proxy.url, token=proxy.session_token) as client:
            info = await client.create()
            await _loop(info.base_url, info.secret, stream, seed=11 if stream else 12)
            summary = await client.get(info.id)
            samples = await client.samples(info.id)
            trace = proxy.registry.get(info.id).trace
            turns = completion_turns(relay.records)
    got = check_against_wire(trace, turns)
    assert got.at == len(turns) and got.rerenders == 0  # one conversation, no re-render
    assert not got.errors
    # One exchange per turn, or two where a stream that lost ids was resumed unstreamed.
    resumed = sum("stream_resumed_unstreamed" in c.flags for c in trace.calls)
    assert len(turns) == len(QUESTIONS) + resumed
    turns = _answers(turns)
    assert {t.stream for t in turns} == {stream}
    # The whole conversation on the wire, with the sampled positions and their logprobs.
    last = turns[-1]
    full = last.prompt + last.ids
    want_mask = np.zeros(len(full), dtype=np.uint8)
    want_lp = np.zeros(len(full), dtype=np.float32)
    for t in turns:
        want_mask[len(t.prompt):len(t.prompt) + len(t.ids)] = 1
        want_lp[len(t.prompt):len(t.prompt) + len(t.ids)] = t.logprobs
    # One sample per branch; the sample builder ends it at a length-cut turn (status
    # truncated). Whatever it keeps is the wire, bit for bit.
    assert len(samples) == 1
    sample = samples[0]
    n = len(sample.tokens)
    assert sample.tokens.tolist() == full[:n]
    assert sample.loss_mask.tolist() == want_mask[:n].tolist()
    assert sample.logprobs is not None
    on = want_mask[:n] == 1
    assert f32_bits(sample.logprobs[on]) == f32_bits(want_lp[:n][on])
    assert not np.isnan(sample.logprobs[~on]).any()
    cut = [k for k, t in enumerate(turns) if t.stop_type == "limit"]
    if cut:
        assert sample.status == "truncated"
        first = turns[cut[0]]
        assert n == len(first.prompt) + len(first.ids)
    else:
        assert sample.status == "completed" and n == len(full)
    assert summary["tito_mismatch"] == 0, summary["tito"]
