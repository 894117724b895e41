"""End to end: the openai SDK drives a multi-turn tool loop through the proxy against the
built-in model; SessionClient collects; the samples equal the trace's branch and the ids and
logprobs the model returned."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import openai
import pytest

from tracewire import SessionError
from tracewire.model import MODEL_NAME, ModelServer
from tracewire.proxy import Proxy, add_session_routes
from tracewire.samples import payload_meta
from tracewire.sessions import SessionClient

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression with + - * / and parentheses.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}
SYSTEM = "You can call tools. Use a tool to compute the result, then reply with 'Answer: <number>'."


@pytest.fixture
async def proxy() -> AsyncIterator[Proxy]:
    async with ModelServer(seed=3) as model, Proxy(model.base_url) as p:
        yield p


async def test_openai_tool_loop_then_collect(proxy: Proxy) -> None:
    async with SessionClient(proxy.url, token=proxy.session_token, timeout=120) as client:
        info = await client.create(metadata={"task": "calc-1"}, group_id="g7", group_index=1)
        oai = openai.AsyncOpenAI(base_url=info.base_url, api_key=info.secret, max_retries=0)
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Use the calculator to compute (47 + 5) * 3."},
        ]
        returned: list[tuple[list[int], list[float], str]] = []
        for turn in range(4):
            r = await oai.chat.completions.create(
                model=MODEL_NAME,
                messages=messages,  # type: ignore[arg-type]
                tools=[CALCULATOR],  # type: ignore[list-item]
                tool_choice=(
                    {"type": "function", "function": {"name": "calculator"}} if turn < 2 else "none"
                ),  # type: ignore[arg-type]
                seed=turn,
                max_tokens=48,
                logprobs=True,
                extra_body={"return_token_ids": True},
            )
            choice = r.choices[0]
            ids = (choice.model_extra or {})["token_ids"]
            assert choice.logprobs is not None and choice.logprobs.content is not None
            lps = [e.logprob for e in choice.logprobs.content]
            returned.append((ids, lps, str(choice.finish_reason)))
            msg = choice.message
            entry: dict[str, Any] = {"role": "assistant", "content": msg.content}
            if msg.tool_calls:
                entry["tool_calls"] = [tc.model_dump() for tc in msg.tool_calls]
            messages.append(entry)
            if not msg.tool_calls:
                break
            for tc in msg.tool_calls:
                messages.append(
                    {"role": "tool", "tool_call_id": tc.id, "content": json.dumps({"result": 156})}
                )
        await oai.close()
        assert len(returned) >= 3  # two forced tool calls, then an answer

        session = proxy.registry.get(info.id)
        trace = session.trace
        summary = await client.get(info.id)
        assert summary["turns"] == len(returned) and summary["branches"] == 1
        samples = await client.collect(info.id, metadata={"step": 9})

    (s,) = samples
    want_status = "truncated" if returned[-1][2] == "length" else "completed"
    assert s.status == want_status
    assert (s.group_id, s.group_index) == ("g7", 1)
    assert s.metadata["task"] == "calc-1" and s.metadata["step"] == 9
    assert s.metadata["session_id"] == info.id
    # The sample is the trace's branch, token for token.
    branch = trace.branch(s.leaf)
    assert np.array_equal(s.tokens, branch.ids)
    assert np.array_equal(s.loss_mask, branch.mask)
    assert s.logprobs is not None
    assert np.array_equal(s.logprobs, np.nan_to_num(branch.logprobs, nan=0.0))
    # Each model turn's span holds exactly the ids and logprobs the model returned.
    assert len(s.spans) == len(returned)
    for (_node, start, end), (ids, lps, _finish) in zip(s.spans, returned, strict=True):
        assert s.tokens[start:end].tolist() == ids
        assert np.array_equal(s.logprobs[start:end], np.asarray(lps, dtype=np.float32))
        assert s.loss_mask[start:end].all()
    # Everything between model turns (tool results, templates) is mask 0, logprob 0.
    trainable = np.zeros(len(s.tokens), dtype=bool)
    for _node, start, end in s.spans:
        trainable[start:end] = True
    assert not s.loss_mask[~trainable].any() and not s.logprobs[~trainable].any()
    assert s.prompt_len == s.spans[0][1]
    # The collect also deleted the session.
    with pytest.raises(SessionError, match="deleted"):
        proxy.registry.get(info.id)


async def test_concurrent_generations_become_branches_never_silently_dropped(
    proxy: Proxy,
) -> None:
    async with SessionClient(proxy.url, token=proxy.session_token, timeout=120) as client:
        info = await client.create()
        oai = openai.AsyncOpenAI(base_url=info.base_url, api_key=info.secret, max_retries=0)
        messages = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Use the calculator to compute 2 + 2."},
        ]

        async def ask(seed: int) -> Any:
            return await oai.chat.completions.create(
                model=MODEL_NAME,
                messages=messages,  # type: ignore[arg-type]
                seed=seed,
                max_tokens=16,
                logprobs=True,
            )

        await asyncio.gather(ask(1), ask(2))
        await oai.close()
        trace = proxy.registry.get(info.id).trace
        completions = [c.node for c in trace.calls if c.node is not None]
        assert len(completions) == 2
        # Both paid generations are in the trace, as sibling leaves.
        assert sorted(trace.leaves()) == sorted(completions)
        data = await client.payload(info.id)
        meta = payload_meta(data)
        # The default picker keeps the later one and names the other in the payload.
        assert [s["leaf"] for s in meta["samples"]] == [max(completions)]
        assert meta["info"]["dropped_leaves"] == [min(completions)]
        # A picker that keeps everything gets both.
        api = add_session_routes(proxy.app, proxy)
        api.picker = None
        both = await client.collect(info.id, metadata={"all": True})
        assert [s.leaf for s in both] == sorted(completions)
        assert both[0].prompt_len == both[1].prompt_len
        assert np.array_equal(
            both[0].tokens[: both[0].prompt_len], both[1].tokens[: both[1].prompt_len]
        )
