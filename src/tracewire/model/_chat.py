"""``POST /v1/chat/completions``: OpenAI chat shape plus vLLM's token fields, with streaming."""

from __future__ import annotations

import asyncio
import codecs
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import orjson
from aiohttp import web

from ._engine import Engine, Generation, TokenStep
from ._foreign import ForeignModel
from ._policy import Policy
from ._protocol import (
    MAX_MODEL_LEN,
    MAX_N,
    MAX_TOP_LOGPROBS,
    MODEL_NAME,
    RequestError,
    TokenRender,
    Validated,
    forced_calls,
    tool_choice,
)
from ._template import ChatTemplate

__all__ = ["Shared", "chat_completions", "drive", "rng_for"]

#: Longest run of generation on the event loop before yielding to other tasks.
SLICE_S = 0.001
#: Bodies with more text than this are rendered/tokenized in a worker thread.
THREAD_CHARS = 16_384


@dataclass
class Shared:
    """What every handler needs: the engine, the template and the server's seed/counter."""

    engine: Engine
    template: ChatTemplate
    seed: int
    counter: int = 0
    max_model_len: int = MAX_MODEL_LEN
    #: Trainable weights by version (empty: the untrained model); see ModelServer.set_policy.
    policies: dict[int, Policy] = field(default_factory=dict)
    latest: int | None = None
    #: A tokenizer directory sampled over instead of the built-in vocabulary (None: built-in).
    foreign: ForeignModel | None = None
    #: Split probability of foreign tokens when a request does not say (``--non-canonical``).
    non_canonical: float = 0.0

    def next_request(self) -> int:
        self.counter += 1
        return self.counter

    def policy_for(self, request: web.Request) -> Policy | None:
        """The weights a request samples with: the version its path names, else the latest."""
        raw = request.match_info.get("version")
        if raw is None:
            return None if self.latest is None else self.policies[self.latest]
        try:
            return self.policies[int(raw)]
        except (ValueError, KeyError):
            raise RequestError(f"policy version {raw!r} is not served here", "model", 404,
                               "policy_not_found", "not_found_error") from None


async def drive(gen: Generation) -> AsyncIterator[TokenStep]:
    """Yield the generation's tokens, giving the loop back at least every :data:`SLICE_S`."""
    until = time.perf_counter() + SLICE_S
    while (step := gen.step()) is not None:
        yield step
        if time.perf_counter() > until:
            await asyncio.sleep(0)
            until = time.perf_counter() + SLICE_S


def rng_for(shared: Shared, seed: int | None, choice: int) -> np.random.Generator:
    """Per-choice generator: request seed (or server seed + request counter) and choice index."""
    if seed is not None:
        return np.random.default_rng([seed & ((1 << 64) - 1), choice])
    return np.random.default_rng([shared.seed & ((1 << 64) - 1), shared.next_request(), choice])


async def maybe_thread(size: int, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` inline when small, else in a worker thread (keeps the loop responsive)."""
    if size > THREAD_CHARS:
        return await asyncio.to_thread(fn)
    return fn()


def _body_size(messages: Any) -> int:
    return sum(len(str(m.get("content") or "")) for m in messages if isinstance(m, Mapping))


def declared_names(tools: Any) -> tuple[str, ...] | None:
    """Names of the request's tools (already validated by the template), or None."""
    if not tools:
        return None
    return tuple(t["function"]["name"] for t in tools)


def sse_event(obj: Any) -> bytes:
    """One server-sent event carrying ``obj`` as JSON."""
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _call_json(name: str, args: str, index: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                           "function": {"name": name, "arguments": args}}
    if index is not None:
        out = {"index": index, **out}
    return out


async def chat_completions(request: web.Request, shared: Shared, body: Any) -> web.StreamResponse:
    """Handle one chat completion request (body already parsed)."""
    e, tpl = shared.engine, shared.template
    v = Validated(body)
    v.model()
    messages, tools = v.body.get("messages"), v.body.get("tools")
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list", "messages")
    if tools is not None and not isinstance(tools, list):
        raise RequestError("'tools' must be a list", "tools")
    prompt: list[int] = await maybe_thread(_body_size(messages),
                                           lambda: tpl.render(messages, tools or None))
    n = v.integer("n", 1, 1, MAX_N) or 1
    params = v.sampling(len(prompt), default_max=1024, max_model_len=shared.max_model_len)
    want_lp = v.boolean("logprobs")
    top = v.integer("top_logprobs", 0, 0, MAX_TOP_LOGPROBS) or 0
    mode, prefix = tool_choice(v, e)
    params = replace(params, top_logprobs=top if want_lp else 0, tool_choice=mode, prefix=prefix,
                     stop_in_calls=False, tool_names=declared_names(tools))
    force = v.extension().get("force")
    if force is not None:
        if not isinstance(force, Mapping) or not isinstance(force.get("text", ""), str):
            raise RequestError("tracewire.force must be {'text': str, 'tool_calls': [...]}",
                               "tracewire")
        ids = tpl.assistant_ids(force.get("text", ""), forced_calls(force.get("tool_calls")))
        params = replace(params, forced=tuple(ids), prefix=())
    return_ids = v.boolean("return_token_ids")
    render = TokenRender(e, v.boolean("return_tokens_as_token_ids"))
    seed = v.seed()
    stream = v.boolean("stream")
    opts = v.body.get("stream_options")
    if opts is not None and not isinstance(opts, Mapping):
        raise RequestError("'stream_options' must be an object", "stream_options")
    usage_in_stream = bool(opts and opts.get("include_usage"))
    head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()),
            "model": MODEL_NAME}
    policy = shared.policy_for(request)
    gens = [Generation(e, prompt, params, rng_for(shared, seed, i), policy) for i in range(n)]
    if stream:
        return await _stream(request, shared, head, prompt, gens, want_lp, render, return_ids,
                             usage_in_stream)
    choices = []
    for i, gen in enumerate(gens):
        steps = [s async for s in drive(gen)]
        parsed = tpl.parse(gen.tokens)
        content = parsed.content if gen.stop_cut is None else parsed.content[: gen.stop_cut]
        finish = gen.finish_reason
        if finish == "stop" and parsed.complete and parsed.tool_calls:
            finish = "tool_calls"
        msg: dict[str, Any] = {"role": "assistant",
                               "content": content if content or not parsed.tool_calls else None}
        if parsed.tool_calls:
            msg["tool_calls"] = [_call_json(a, b) for a, b in parsed.tool_calls]
        choice: dict[str, Any] = {
            "index": i, "message": msg, "finish_reason": finish,
            "logprobs": {"content": [render.chat_entry(s) for s in steps]} if want_lp else None}
        if return_ids:
            choice["token_ids"] = gen.tokens
        choices.append(choice)
    done = sum(len(g.tokens) for g in gens)
    out: dict[str, Any] = {**head, "object": "chat.completion", "choices": choices,
                           "usage": {"prompt_tokens": len(prompt), "completion_tokens": done,
                                     "total_tokens": len(prompt) + done},
                           "tracewire": {"tool_choice": mode,
                                         "policy_version": policy and policy.version}}
    if return_ids:
        out["prompt_token_ids"] = prompt
    return web.Response(body=orjson.dumps(out), content_type="application/json")


async def _stream(
    request: web.Request, shared: Shared, head: dict[str, Any], prompt: list[int],
    gens: list[Generation], want_lp: bool, render: TokenRender, return_ids: bool,
    usage: bool,
) -> web.StreamResponse:
    e = shared.engine
    sp = e.tok.special
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                       "Cache-Control": "no-cache"})
    await resp.prepare(request)
    base = {**head, "object": "chat.completion.chunk"}
    if usage:
        base["usage"] = None

    def chunk(i: int, delta: dict[str, Any], steps: list[TokenStep], finish: str | None,
              first: bool = False) -> bytes:
        c: dict[str, Any] = {"index": i, "delta": delta, "finish_reason": finish,
                             "logprobs": ({"content": [render.chat_entry(s) for s in steps]}
                                          if want_lp and steps else None)}
        if return_ids:
            c["token_ids"] = [s.token for s in steps]
        obj: dict[str, Any] = {**base, "choices": [c]}
        if first and return_ids:
            obj["prompt_token_ids"] = prompt
        return sse_event(obj)

    for i, gen in enumerate(gens):
        await resp.write(chunk(i, {"role": "assistant", "content": ""}, [], None, first=i == 0))
        dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
        visible, emitted, pending = "", 0, []
        hold = max((len(s) for s in gen.p.stop), default=1) - 1
        in_call, name, args, calls, target = False, b"", b"", 0, "name"
        async for s in drive(gen):
            pending.append(s)
            t = s.token
            if t == sp["<|call|>"]:
                in_call, name, args, target = True, b"", b"", "name"
            elif t == sp["<|args|>"] and in_call:
                target = "args"
            elif t == sp["<|endcall|>"] and in_call:
                call = _call_json(name.decode("utf-8", "replace"), args.decode("utf-8", "replace"),
                                  calls)
                await resp.write(chunk(i, {"tool_calls": [call]}, pending, None))
                pending, in_call, calls = [], False, calls + 1
            elif in_call and not e.tok.is_special(t):
                if target == "name":
                    name += e.tok.token_bytes(t)
                else:
                    args += e.tok.token_bytes(t)
            elif not e.tok.is_special(t) and gen.finish_reason is None:
                visible += dec.decode(e.tok.token_bytes(t))
                safe = max(emitted, len(visible) - hold)
                await resp.write(chunk(i, {"content": visible[emitted:safe]}, pending, None))
                emitted, pending = safe, []
            elif not e.tok.is_special(t):
                visible += dec.decode(e.tok.token_bytes(t))
        final = visible if gen.stop_cut is None else visible[: gen.stop_cut]
        finish = gen.finish_reason
        if finish == "stop" and calls and gen.tokens and gen.tokens[-1] == e.tok.eot_id:
            finish = "tool_calls"
        delta = {"content": final[emitted:]} if len(final) > emitted else {}
        await resp.write(chunk(i, delta, pending, finish))
    if usage:
        done = sum(len(g.tokens) for g in gens)
        await resp.write(sse_event({**base, "choices": [], "usage": {
            "prompt_tokens": len(prompt), "completion_tokens": done,
            "total_tokens": len(prompt) + done}}))
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp
