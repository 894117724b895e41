"""``POST /v1/completions``: text or token-id prompts, ``echo`` + ``logprobs`` for rescoring."""

from __future__ import annotations

import asyncio
import codecs
import time
import uuid
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import orjson
from aiohttp import web

from .._errors import ModelError
from ._chat import SLICE_S, Shared, maybe_thread, rng_for, sse_event
from ._constraints import DecodeState
from ._engine import Generation, TokenStep
from ._foreign_chat import foreign_completions
from ._policy import Policy
from ._protocol import (
    MAX_N,
    MAX_TOP_LOGPROBS,
    MODEL_NAME,
    RequestError,
    TokenRender,
    Validated,
    completion_logprobs,
)
from ._runs import drive_stops, stop_token_ids

__all__ = ["completions"]

_MODES = ("auto", "none", "required")


async def score_prompt(shared: Shared, ids: list[int], temperature: float, top_p: float,
                 top_k: int, policy: Policy | None = None, tool_choice: str = "auto",
                 tool_names: tuple[str, ...] | None = None) -> list[TokenStep | None]:
    """Prompt log-probabilities, computed in loop-friendly slices."""
    e = shared.engine
    out: list[TokenStep | None] = [None]
    st = DecodeState(tool_choice=tool_choice, names=e.name_ids(tool_names))
    e.cons.advance(st, ids[0])
    until = time.perf_counter() + SLICE_S
    for i in range(1, len(ids)):
        out.append(e.score_one(ids, i, st, temperature, top_p, top_k, policy))
        e.cons.advance(st, ids[i])
        if time.perf_counter() > until:
            await asyncio.sleep(0)
            until = time.perf_counter() + SLICE_S
    return out


def _prompt_ids(shared: Shared, raw: Any) -> tuple[list[int], int]:
    if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], str | list):
        raw = raw[0]  # a batch of one
    if isinstance(raw, str):
        if not raw:
            raise RequestError("'prompt' must not be empty", "prompt")
        return shared.engine.tok.encode_with_special(raw), len(raw)
    if (isinstance(raw, list) and raw
            and all(isinstance(t, int) and not isinstance(t, bool) for t in raw)):
        try:
            shared.engine.tok.check_ids(raw)
        except ModelError as exc:
            raise RequestError(str(exc), "prompt") from exc
        return [int(t) for t in raw], len(raw)
    raise RequestError("'prompt' must be a non-empty string or a list of token ids "
                       "(batches of more than one prompt are not supported)", "prompt")


async def completions(request: web.Request, shared: Shared, body: Any) -> web.StreamResponse:
    """Handle one legacy completion request (body already parsed)."""
    if shared.foreign is not None:
        return await foreign_completions(request, shared, body)
    e = shared.engine
    v = Validated(body)
    v.model()
    raw = v.body.get("prompt")
    prompt, size = await maybe_thread(
        len(raw) if isinstance(raw, str) else 0, lambda: _prompt_ids(shared, raw))
    echo = v.boolean("echo")
    n = v.integer("n", 1, 1, MAX_N) or 1
    params = v.sampling(len(prompt), default_max=16, allow_zero=echo,
                        max_model_len=shared.max_model_len)
    want = v.integer("logprobs", None, 0, MAX_TOP_LOGPROBS)
    ext = v.extension()
    mode = ext.get("tool_choice", "auto")
    if mode not in _MODES:
        raise RequestError(f"tracewire.tool_choice must be one of {_MODES}", "tracewire")
    # the tools a rendered chat prompt declares constrain call names as they did in chat,
    # so rescoring a chat turn here reproduces its logprobs
    params = replace(params, top_logprobs=want or 0, tool_choice=str(mode),
                     tool_names=shared.template.declared_tools(prompt))
    force = ext.get("force")
    if force is not None:
        if not isinstance(force, Mapping) or not isinstance(force.get("text"), str):
            raise RequestError("tracewire.force must be {'text': str}", "tracewire")
        params = replace(params, forced=tuple(e.tok.encode_with_special(force["text"])))
    render = TokenRender(e, v.boolean("return_tokens_as_token_ids"))
    return_ids = v.boolean("return_token_ids")
    stops = stop_token_ids(shared, v.body, "stop_token_ids")
    v.boolean("skip_special_tokens")  # accepted; the text spells specials either way
    seed = v.seed()
    head = {"id": f"cmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": MODEL_NAME}
    policy = shared.policy_for(request)
    prompt_steps: list[TokenStep | None] = []
    if echo and want is not None:
        prompt_steps = await score_prompt(shared, prompt, params.temperature, params.top_p, want,
                                    policy, params.tool_choice, params.tool_names)
    prompt_text = e.tok.decode(prompt) if echo else ""
    gens = [Generation(e, prompt, params, rng_for(shared, seed, i), policy) for i in range(n)]
    if v.boolean("stream"):
        return await _stream(request, shared, head, prompt, prompt_text, prompt_steps, gens,
                             want, render, return_ids, stops)
    choices = []
    del size
    for i, gen in enumerate(gens):
        steps = [s async for s in drive_stops(gen, stops)]
        ids = gen.tokens
        ended = {e.tok.eot_id, *stops}
        shown = ids[:-1] if ids and ids[-1] in ended and gen.finish_reason == "stop" else ids
        text = e.tok.decode(shown)
        if gen.stop_cut is not None:
            text = text[: gen.stop_cut]
        lp = None
        if want is not None:
            all_ids = (prompt if echo else []) + ids
            all_steps: list[TokenStep | None] = [*(prompt_steps if echo else []), *steps]
            lp = completion_logprobs(render, all_steps, all_ids, 0, want > 0)
        choice: dict[str, Any] = {"index": i, "text": prompt_text + text, "logprobs": lp,
                                  "finish_reason": gen.finish_reason}
        if return_ids:
            choice["prompt_token_ids"] = prompt
            choice["token_ids"] = ids
        choices.append(choice)
    done = sum(len(g.tokens) for g in gens)
    out = {**head, "object": "text_completion", "choices": choices,
           "usage": {"prompt_tokens": len(prompt), "completion_tokens": done,
                     "total_tokens": len(prompt) + done}}
    return web.Response(body=orjson.dumps(out), content_type="application/json")


async def _stream(
    request: web.Request, shared: Shared, head: dict[str, Any], prompt: list[int],
    prompt_text: str, prompt_steps: list[TokenStep | None], gens: list[Generation],
    want: int | None, render: TokenRender, return_ids: bool, stops: tuple[int, ...] = (),
) -> web.StreamResponse:
    e = shared.engine
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                       "Cache-Control": "no-cache"})
    await resp.prepare(request)
    base = {**head, "object": "text_completion"}

    prompt_pending = [True]

    def chunk(i: int, text: str, ids: list[int], steps: list[TokenStep | None],
              finish: str | None) -> bytes:
        c: dict[str, Any] = {"index": i, "text": text, "finish_reason": finish,
                             "logprobs": (completion_logprobs(render, steps, ids, 0, bool(want))
                                          if want is not None and ids else None)}
        if return_ids:
            c["token_ids"] = ids
            if prompt_pending[0]:  # as vLLM: the prompt's ids ride on the first chunk only
                c["prompt_token_ids"] = prompt
                prompt_pending[0] = False
        return sse_event({**base, "choices": [c]})

    for i, gen in enumerate(gens):
        if prompt_text:
            first = chunk(i, prompt_text, prompt, prompt_steps, None) if want is not None else \
                chunk(i, prompt_text, [], [], None)
            await resp.write(first)
        dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
        visible, emitted = "", 0
        hold = max((len(s) for s in gen.p.stop), default=1) - 1
        ids: list[int] = []
        steps: list[TokenStep | None] = []
        async for s in drive_stops(gen, stops):
            ids.append(s.token)
            steps.append(s)
            if not (s.token in (e.tok.eot_id, *stops) and gen.finish_reason == "stop"):
                visible += dec.decode(e.tok.token_bytes(s.token))
            if gen.finish_reason is None:
                safe = max(emitted, len(visible) - hold)
                await resp.write(chunk(i, visible[emitted:safe], ids, steps, None))
                emitted, ids, steps = safe, [], []
        final = visible if gen.stop_cut is None else visible[: gen.stop_cut]
        await resp.write(chunk(i, final[emitted:], ids, steps, gen.finish_reason))
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp
