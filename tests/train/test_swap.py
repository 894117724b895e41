"""Swapping weights into a running model server: requests in flight finish on theirs."""

from __future__ import annotations

import asyncio

import numpy as np
import openai

from tracewire.model import MODEL_NAME, ChatTemplate, ModelServer, Policy, get_engine, rescore

MSGS = [{"role": "user", "content": "Tell me a long story."}]
LONG = "one two three four five six seven eight nine ten " * 25  # a few hundred forced tokens


def _policy(version: int, seed: int) -> Policy:
    v = get_engine().tok.vocab_size
    rng = np.random.default_rng(seed)
    return Policy.zeros(v).updated(rng.normal(0, 1.0, v), rng.normal(0, 1.0, (v, v)), version)


async def _stream(client: openai.AsyncOpenAI, started: asyncio.Event,
                  ) -> tuple[list[int], list[int], list[float], int]:
    """(prompt ids, ids, logprobs, ids received before ``started`` was set by the test)."""
    stream = await client.chat.completions.create(
        model=MODEL_NAME, messages=MSGS, stream=True, logprobs=True, max_tokens=2000,  # type: ignore[arg-type]
        extra_body={"return_token_ids": True, "tracewire": {"force": {"text": LONG}}})
    prompt: list[int] = []
    ids: list[int] = []
    lps: list[float] = []
    before = -1
    async for chunk in stream:
        extra = chunk.model_extra or {}
        prompt = extra.get("prompt_token_ids") or prompt
        for c in chunk.choices:
            ids += (c.model_extra or {}).get("token_ids") or []
            if c.logprobs is not None and c.logprobs.content:
                lps += [e.logprob for e in c.logprobs.content]
        if ids and before < 0:
            before = len(ids)
            started.set()
            await asyncio.sleep(0)
    return prompt, ids, lps, before


async def test_swap_during_inflight_requests_drops_none() -> None:
    e = get_engine()
    tpl = ChatTemplate(e.tok)
    v0, v1 = _policy(0, 1), _policy(1, 2)
    async with ModelServer() as server:
        server.set_policy(v0)
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="none", max_retries=0)
        events = [asyncio.Event() for _ in range(4)]
        tasks = [asyncio.create_task(_stream(client, ev)) for ev in events]
        await asyncio.gather(*(ev.wait() for ev in events))
        server.set_policy(v1)  # every stream is mid-generation now
        done = await asyncio.gather(*tasks)  # none dropped: each returns, none raises
        after = await client.chat.completions.create(
            model=MODEL_NAME, messages=MSGS, logprobs=True, max_tokens=50,  # type: ignore[arg-type]
            extra_body={"return_token_ids": True, "tracewire": {"force": {"text": LONG}}})
        pinned = openai.AsyncOpenAI(base_url=server.url_for(0), api_key="none")
        assert [m.id for m in (await pinned.models.list()).data] == [MODEL_NAME]
        old = await pinned.chat.completions.create(
            model=MODEL_NAME, messages=MSGS, logprobs=True, max_tokens=50,  # type: ignore[arg-type]
            extra_body={"return_token_ids": True, "tracewire": {"force": {"text": LONG}}})
        await client.close()
        await pinned.close()
    for prompt, ids, lps, before in done:
        assert len(ids) == len(lps) > before > 0  # tokens were generated after the swap
        mask = [0] * len(prompt) + [1] * len(ids)
        r0 = rescore(e, tpl, prompt + ids, mask, len(prompt), v0)
        r1 = rescore(e, tpl, prompt + ids, mask, len(prompt), v1)
        assert r0.logprobs.tolist() == lps  # all of it sampled by the weights it started on
        assert r1.logprobs.tolist() != lps
    for resp, policy in ((after, v1), (old, v0)):
        assert (resp.model_extra or {})["tracewire"]["policy_version"] == policy.version
        choice = resp.choices[0]
        ids = (choice.model_extra or {})["token_ids"]
        prompt = (resp.model_extra or {})["prompt_token_ids"]
        r = rescore(e, tpl, prompt + ids, [0] * len(prompt) + [1] * len(ids), len(prompt),
                    policy)
        assert choice.logprobs is not None and choice.logprobs.content is not None
        assert r.logprobs.tolist() == [x.logprob for x in choice.logprobs.content]


async def test_unknown_policy_version_is_404() -> None:
    async with ModelServer() as server:
        server.set_policy(_policy(3, 0))
        client = openai.AsyncOpenAI(base_url=server.url_for(2), api_key="none", max_retries=0)
        try:
            await client.chat.completions.create(model=MODEL_NAME, messages=MSGS)  # type: ignore[arg-type]
        except openai.NotFoundError as exc:
            assert "policy version" in str(exc)
        else:
            raise AssertionError("a version never served must be refused")
        finally:
            await client.close()
