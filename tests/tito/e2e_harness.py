"""End-to-end pieces: a deterministic 'model' that reads its prompt, a fake chat server that
re-renders the whole history every turn (as vLLM's chat endpoint does), and tool-calling
harness loops over the real openai and anthropic SDKs.

The fakes are mocks by necessity (no vLLM can run here); the proxy, the SDKs, the sockets
and the tokenizer/template code path are real.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import anthropic
import openai
from aiohttp import web

from tracewire.proxy import Session
from tracewire.tito import PromptBuilder, parse_completion

from .helpers import TOOLS, completion_text, sample_ids

TURNS = 20
#: Room for the fakes' non-canonical samples (one token per character run past 64 ids): the
#: proxy refuses a reply with more ids than the request asked for.
MAX_TOKENS = 256
ANTHROPIC_TOOLS = [{"name": "lookup", "description": "Look a key up.",
                    "input_schema": TOOLS[0]["function"]["parameters"]}]
RESPONSES_TOOLS = [{"type": "function", "name": "lookup", "description": "Look a key up.",
                    "parameters": TOOLS[0]["function"]["parameters"]}]


def lps(n: int) -> list[float]:
    """The logprobs the fakes report for ``n`` sampled ids."""
    return [-0.5 - 0.01 * i for i in range(n)]


@dataclass
class Policy:
    """Samples from the prompt: turn ``t`` is the number of tool results in it; a tool call
    until the last turn, then a final answer. Every third turn is sampled non-canonically
    (one token per character). ``special`` maps a request's index to ``"length"`` (cut, no close) or
    ``"malformed"`` (a tool call that does not parse)."""

    b: PromptBuilder
    family: str
    turns: int = TURNS
    special: dict[int, str] = field(default_factory=dict)
    log: list[tuple[list[int], list[int]]] = field(default_factory=list)

    def __call__(self, prompt: list[int]) -> tuple[list[int], str, str]:
        t = self.b.tok.decode(prompt).count("result ")
        kind = self.special.get(len(self.log))
        if kind == "length":
            ids = sample_ids(self.b, f"step {t} and then", stop=False)
            finish = "length"
        elif kind == "malformed":
            text = ('{"name": "lookup", "parameters": {"i": oops' if self.family == "llama3"
                    else f'step {t}\n<tool_call>\n{{"name": "lookup", "arguments": {{"i": '
                         f'oops</tool_call>')
            ids, finish = sample_ids(self.b, text), "stop"
        else:
            text = completion_text(self.family, t, call=t < self.turns - 1)
            ids, finish = sample_ids(self.b, text, canonical=t % 3 != 1), "stop"
        self.log.append((list(prompt), ids))
        return ids, self.b.tok.decode(ids), finish


def chat_app(b: PromptBuilder, policy: Policy) -> web.Application:
    """A vLLM-like chat endpoint: renders the whole conversation with the template every
    turn (so re-rendered history replaces what was sampled), samples with ``policy``."""

    async def chat(req: web.Request) -> web.Response:
        body = await req.json()
        assert not body.get("stream"), "the pass-through comparison runs unary"
        prompt = b.render_full(body["messages"], body.get("tools")).ids
        ids, text, finish = policy(prompt)
        parsed = parse_completion(text, b.family)
        return web.json_response({
            "id": "chatcmpl-1", "object": "chat.completion", "model": "m",
            "prompt_token_ids": prompt,
            "choices": [{"index": 0, "message": parsed.as_message(),
                         "finish_reason": "tool_calls" if parsed.tool_calls else finish,
                         "token_ids": ids,
                         "logprobs": {"content": [{"token": f"token_id:{i}", "logprob": lp,
                                                   "top_logprobs": []}
                                                  for i, lp in zip(ids, lps(len(ids)),
                                                                   strict=True)]}}],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids),
                      "total_tokens": len(prompt) + len(ids)}})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


# -- harness loops -------------------------------------------------------------------------

async def chat_loop(s: Session, stream: bool, turns: int = TURNS,
                    history: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """OpenAI chat completions tool loop; returns the final history."""
    client = openai.AsyncOpenAI(base_url=s.base_url, api_key=s.secret, max_retries=0)
    msgs = history or [{"role": "system", "content": "Be brief."},
                       {"role": "user", "content": "look keys up"}]
    try:
        for _ in range(turns):
            kw: dict[str, Any] = {"model": "m", "messages": msgs, "tools": TOOLS,
                                  "max_tokens": MAX_TOKENS}
            if stream:
                content, calls = "", {}
                async for ch in await client.chat.completions.create(stream=True, **kw):
                    if not ch.choices:
                        continue
                    d = ch.choices[0].delta
                    content += d.content or ""
                    for tc in d.tool_calls or ():
                        c = calls.setdefault(tc.index, {"id": "", "type": "function",
                                                        "function": {"name": "",
                                                                     "arguments": ""}})
                        c["id"] = tc.id or c["id"]
                        if tc.function is not None:
                            c["function"]["name"] += tc.function.name or ""
                            c["function"]["arguments"] += tc.function.arguments or ""
                msg: dict[str, Any] = {"role": "assistant", "content": content or None}
                if calls:
                    msg["tool_calls"] = [calls[k] for k in sorted(calls)]
            else:
                r = await client.chat.completions.create(**kw)
                msg = r.choices[0].message.model_dump(exclude_none=True)
            msgs.append(msg)
            tcs = msg.get("tool_calls") or []
            if not tcs:
                msgs.append({"role": "user", "content": "go on"})
            for tc in tcs:
                msgs.append({"role": "tool", "tool_call_id": tc["id"],
                             "content": f"result {len(msgs)}"})
    finally:
        await client.close()
    return msgs


async def responses_loop(s: Session, stream: bool, turns: int = TURNS) -> None:
    """OpenAI Responses tool loop."""
    client = openai.AsyncOpenAI(base_url=s.base_url, api_key=s.secret, max_retries=0)
    items: list[dict[str, Any]] = [{"role": "user", "content": "look keys up"}]
    try:
        for _ in range(turns):
            kw: dict[str, Any] = {"model": "m", "input": items, "tools": RESPONSES_TOOLS,
                                  "max_output_tokens": MAX_TOKENS, "instructions": "Be brief."}
            if stream:
                r = None
                async for ev in await client.responses.create(stream=True, **kw):
                    if ev.type == "response.completed":
                        r = ev.response
                assert r is not None
            else:
                r = await client.responses.create(**kw)
            out = [o.model_dump(exclude_none=True) for o in r.output]
            items += out
            calls = [o for o in out if o["type"] == "function_call"]
            items += [{"type": "function_call_output", "call_id": c["call_id"],
                       "output": f"result {len(items)}"} for c in calls] or [
                {"role": "user", "content": "go on"}]
    finally:
        await client.close()


async def messages_loop(s: Session, stream: bool, turns: int = TURNS) -> None:
    """Anthropic Messages tool loop."""
    client = anthropic.AsyncAnthropic(base_url=s.anthropic_base_url, api_key=s.secret,
                                      max_retries=0)
    msgs: list[Any] = [{"role": "user", "content": "look keys up"}]
    try:
        for _ in range(turns):
            kw: dict[str, Any] = {"model": "m", "max_tokens": MAX_TOKENS, "messages": msgs,
                                  "tools": ANTHROPIC_TOOLS, "system": "Be brief."}
            if stream:
                async with client.messages.stream(**kw) as st:
                    m = await st.get_final_message()
            else:
                m = await client.messages.create(**kw)
            blocks = [{k: v for k, v in b.model_dump(exclude_none=True).items()
                       if k != "citations"} for b in m.content]
            msgs.append({"role": "assistant", "content": blocks})
            uses = [b for b in blocks if b["type"] == "tool_use"]
            msgs.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": b["id"],
                 "content": f"result {len(msgs)}"} for b in uses] if uses else "go on"})
    finally:
        await client.close()


LOOPS = {"chat": chat_loop, "responses": responses_loop, "messages": messages_loop}
