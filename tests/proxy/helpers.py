"""Harness loops with the official SDKs, and checks of a trace against upstream records."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import anthropic
import numpy as np
import openai

from tracewire.trace import Trace

TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "add numbers",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}]
ANTHROPIC_TOOLS = [{"name": "add", "description": "add numbers",
                    "input_schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}]


async def openai_chat_loop(client: openai.AsyncOpenAI, *, turns: int, stream: bool,
                           extra: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """A tool-calling agent loop; returns the assistant messages as the harness saw them."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "be brief"},
                                      {"role": "user", "content": "add things"}]
    seen: list[dict[str, Any]] = []
    for _ in range(turns):
        if stream:
            content, calls = "", {}
            finish = None
            async for chunk in await client.chat.completions.create(
                    model="m", messages=messages, tools=TOOLS, stream=True,
                    extra_body=extra or {}):  # type: ignore[call-overload]
                for ch in chunk.choices:
                    if ch.delta.content:
                        content += ch.delta.content
                    for tc in ch.delta.tool_calls or ():
                        slot = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                        slot["id"] = tc.id or slot["id"]
                        if tc.function and tc.function.name:
                            slot["name"] += tc.function.name
                        if tc.function and tc.function.arguments:
                            slot["arguments"] += tc.function.arguments
                    finish = ch.finish_reason or finish
            msg: dict[str, Any] = {"role": "assistant", "content": content or None}
            if calls:
                msg["tool_calls"] = [{"id": c["id"], "type": "function", "function": {
                    "name": c["name"], "arguments": c["arguments"]}} for c in calls.values()]
        else:
            r = await client.chat.completions.create(
                model="m", messages=messages, tools=TOOLS,  # type: ignore[arg-type]
                extra_body=extra or {})
            msg = r.choices[0].message.model_dump(exclude_none=True)
        seen.append(msg)
        messages.append(msg)
        if msg.get("tool_calls"):
            for tc in msg["tool_calls"]:
                messages.append({"role": "tool", "tool_call_id": tc["id"], "content": "42"})
        else:
            messages.append({"role": "user", "content": "and again"})
    return seen


async def anthropic_loop(client: anthropic.AsyncAnthropic, *, turns: int, stream: bool
                         ) -> list[list[dict[str, Any]]]:
    """A tool-calling loop with the Anthropic SDK; returns each answer's content blocks."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "add things"}]
    seen = []
    for _ in range(turns):
        if stream:
            async with client.messages.stream(model="m", max_tokens=200, system="be brief",
                                              messages=messages, tools=ANTHROPIC_TOOLS) as s:
                m = await s.get_final_message()
        else:
            m = await client.messages.create(model="m", max_tokens=200, system="be brief",
                                             messages=messages, tools=ANTHROPIC_TOOLS)
        blocks = [b.model_dump(exclude_none=True) for b in m.content]
        blocks = [{k: v for k, v in b.items() if k != "citations"} for b in blocks]
        seen.append(blocks)
        messages.append({"role": "assistant", "content": blocks})
        uses = [b for b in blocks if b["type"] == "tool_use"]
        if uses:
            messages.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": b["id"], "content": "42"} for b in uses]})
        else:
            messages.append({"role": "user", "content": "and again"})
    return seen


def check_linear(trace: Trace, prompts: Sequence[Sequence[int]],
                 completions: Sequence[Sequence[int]], logprobs: Sequence[Sequence[float]]
                 ) -> None:
    """The last call's branch holds exactly the upstream's last prompt + completion, mask 1
    exactly on every turn's sampled tokens, and the upstream's logprobs there."""
    assert all(c.error is None for c in trace.calls), [c.error for c in trace.calls]
    assert len(trace.calls) == len(prompts)
    leaf = trace.calls[-1].node
    assert leaf is not None
    br = trace.branch(leaf)
    want = list(prompts[-1]) + list(completions[-1])
    assert br.ids.tolist() == want
    mask = np.zeros(len(want), dtype=np.uint8)
    lps = np.full(len(want), np.nan, dtype=np.float32)
    for p, c, lp in zip(prompts, completions, logprobs, strict=True):
        assert want[len(p):len(p) + len(c)] == list(c)
        mask[len(p):len(p) + len(c)] = 1
        lps[len(p):len(p) + len(c)] = lp
    assert br.mask.tolist() == mask.tolist()
    got = br.logprobs
    for g, w in zip(got.tolist(), lps.tolist(), strict=True):
        assert (math.isnan(g) and math.isnan(w)) or g == w
    assert trace.info.get("token_mismatches", 0) == 0
