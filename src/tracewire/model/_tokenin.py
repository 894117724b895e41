"""Token-in/token-out endpoints: vLLM ``POST /inference/v1/generate`` and SGLang
``POST /generate``, in the shapes those servers answer (streamed or not).

Ids in, ids out, one log-probability per completion id (stop id included). vLLM's generate
answers no text; SGLang's answers text plus ``meta_info.output_token_logprobs`` triples and
streams cumulatively (each chunk repeats the output so far), as SGLang does by default.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import orjson
from aiohttp import web

from ._chat import Shared, sse_event
from ._completions import score_prompt
from ._engine import TokenStep
from ._protocol import MAX_TOP_LOGPROBS, RequestError, Validated
from ._runs import (
    IdRequest,
    Run,
    TextTail,
    check_prompt_ids,
    split_probability,
    stop_token_ids,
    with_last,
)

__all__ = ["sglang_generate", "vllm_generate"]

#: SGLang streams every this many tokens (and at the end); each chunk holds the output so far.
SGLANG_STREAM_INTERVAL = 8


def _sub(v: Validated, name: str) -> Validated:
    raw = v.body.get(name)
    if raw is None:
        return Validated({})
    if not isinstance(raw, Mapping):
        raise RequestError(f"'{name}' must be an object", name)
    return Validated(raw)


def _request_id(v: Validated, name: str, prefix: str) -> str:
    rid = v.body.get(name)
    if rid is None:
        return prefix + uuid.uuid4().hex
    if not isinstance(rid, str) or not 0 < len(rid) <= 256:
        raise RequestError(f"'{name}' must be a non-empty string of at most 256 characters", name)
    return rid


def _id_request(shared: Shared, v: Validated, sp: Validated, prompt: list[int],
                max_name: str, default_max: int, top: int) -> IdRequest:
    # Validated.sampling reads "max_tokens"; SGLang calls it max_new_tokens
    body = dict(sp.body)
    if max_name != "max_tokens":
        body["max_tokens"] = body.pop(max_name, None)
    sv = Validated(body)
    try:
        params = sv.sampling(len(prompt), default_max=default_max,
                             max_model_len=shared.max_model_len)
    except RequestError as exc:
        if exc.param != "max_tokens" or max_name == "max_tokens":
            raise
        raise RequestError(str(exc).replace("'max_tokens'", f"'{max_name}'"), max_name,
                           exc.status, exc.code, exc.type) from None
    params = replace(params, top_logprobs=top)
    n = sv.integer("n", 1, 1, 1)
    del n  # one choice per request, as the token-in routes serve
    return IdRequest(prompt, params, stop_token_ids(shared, sp.body, "sampling_params"),
                     split_probability(shared, v.extension()), sv.seed())


def _entry(s: TokenStep) -> dict[str, Any]:
    return {"token": f"token_id:{s.token}", "logprob": s.logprob,
            "top_logprobs": [{"token": f"token_id:{t}", "logprob": lp} for t, lp in s.top]}


async def vllm_generate(request: web.Request, shared: Shared, body: Any) -> web.StreamResponse:
    """``/inference/v1/generate``: ``{token_ids, sampling_params, model?, request_id?,
    stream?}`` → ``{request_id, choices: [{index, token_ids, logprobs, finish_reason}], usage}``."""
    v = Validated(body)
    v.model()
    prompt = check_prompt_ids(shared, v.body.get("token_ids"), "token_ids")
    sp = _sub(v, "sampling_params")
    want = sp.integer("logprobs", None, 0, MAX_TOP_LOGPROBS)
    req = _id_request(shared, v, sp, prompt, "max_tokens", 16, want or 0)
    rid = _request_id(v, "request_id", "gen-")
    run = Run(shared, req, 0, shared.policy_for(request))

    def usage() -> dict[str, int]:
        return {"prompt_tokens": len(prompt), "completion_tokens": len(run.tokens),
                "total_tokens": len(prompt) + len(run.tokens)}

    def choice(ids: list[int], steps: list[TokenStep], finish: str | None) -> dict[str, Any]:
        return {"index": 0, "token_ids": ids, "finish_reason": finish,
                "logprobs": {"content": [_entry(s) for s in steps]} if want is not None else None}

    if not v.boolean("stream"):
        steps = [s async for s in run.steps()]
        out = {"request_id": rid, "choices": [choice(run.tokens, steps, run.finish_reason)],
               "usage": usage()}
        return web.Response(body=orjson.dumps(out), content_type="application/json")
    resp = await _prepare(request)
    async for s, last in with_last(run):
        finish = run.finish_reason if last else None
        await resp.write(sse_event({"request_id": rid,
                                    "choices": [choice([s.token], [s], finish)]}))
    if not run.tokens:
        await resp.write(sse_event({"request_id": rid,
                                    "choices": [choice([], [], run.finish_reason)]}))
    await resp.write(sse_event({"request_id": rid, "choices": [], "usage": usage()}))
    return await _done(resp)


async def _prepare(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                       "Cache-Control": "no-cache"})
    await resp.prepare(request)
    return resp


async def _done(resp: web.StreamResponse) -> web.StreamResponse:
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


def _sglang_prompt(shared: Shared, v: Validated) -> list[int]:
    if v.body.get("input_ids") is not None:
        return check_prompt_ids(shared, v.body["input_ids"], "input_ids")
    text = v.body.get("text")
    if not isinstance(text, str) or not text:
        raise RequestError("give 'input_ids' (a list of token ids) or 'text'", "input_ids")
    if shared.foreign is not None:
        return shared.foreign.encode_prompt(text)
    return shared.engine.tok.encode_with_special(text)


async def sglang_generate(request: web.Request, shared: Shared, body: Any) -> web.StreamResponse:
    """SGLang ``/generate``: ``{input_ids | text, sampling_params, return_logprob,
    logprob_start_len, top_logprobs_num, rid, stream}`` → ``{text, output_ids, meta_info}``."""
    v = Validated(body)
    if isinstance(v.body.get("input_ids"), list) and v.body["input_ids"] and isinstance(
            v.body["input_ids"][0], list):
        raise RequestError("batched 'input_ids' are not supported; send one prompt",
                           "input_ids")
    prompt = _sglang_prompt(shared, v)
    sp = _sub(v, "sampling_params")
    want_lp = v.boolean("return_logprob")
    top = v.integer("top_logprobs_num", 0, 0, MAX_TOP_LOGPROBS) or 0
    start = v.integer("logprob_start_len", -1, -1, len(prompt) - 1)
    assert start is not None
    if want_lp and start >= 0 and shared.foreign is not None:
        raise RequestError("prompt logprobs (logprob_start_len >= 0) are not available over a "
                           "foreign tokenizer", "logprob_start_len")
    req = _id_request(shared, v, sp, prompt, "max_new_tokens", 128, top if want_lp else 0)
    skip_special = sp.boolean("skip_special_tokens", True)
    no_stop_trim = sp.boolean("no_stop_trim", False)
    rid = _request_id(v, "rid", "")
    run = Run(shared, req, 0, shared.policy_for(request))
    prompt_lp: list[list[Any]] = []
    if want_lp and start >= 0:
        p = req.params
        scored = await score_prompt(shared, prompt, p.temperature, p.top_p, top,
                              shared.policy_for(request), "auto",
                              shared.template.declared_tools(prompt))
        prompt_lp = [[None if s is None else s.logprob, t, None]
                     for s, t in zip(scored[start:], prompt[start:], strict=True)]
    decode = (shared.foreign.decode if shared.foreign is not None
              else shared.engine.tok.decode)
    specials = (shared.foreign.special_ids if shared.foreign is not None
                else frozenset(shared.engine.tok.special.values()))
    stops = set(req.stop_ids) | _default_stops(shared, req)

    def shown(ids: list[int], final: bool) -> list[int]:
        if final and not no_stop_trim and ids and ids[-1] in stops and run.finish_reason == "stop":
            ids = ids[:-1]
        return [t for t in ids if not (skip_special and t in specials)]

    steps: list[TokenStep] = []

    def reply(text: str, final: bool) -> dict[str, Any]:
        ids = [s.token for s in steps]  # run.tokens runs one ahead while streaming
        meta: dict[str, Any] = {
            "id": rid, "prompt_tokens": len(prompt), "completion_tokens": len(ids),
            "cached_tokens": 0, "finish_reason": _sglang_finish(run, ids) if final else None}
        if want_lp:
            meta["output_token_logprobs"] = [[s.logprob, s.token, None] for s in steps]
            if start >= 0:
                meta["input_token_logprobs"] = prompt_lp
            if top:
                meta["output_top_logprobs"] = [[[lp, t, None] for t, lp in s.top] for s in steps]
        return {"text": text, "output_ids": list(ids), "meta_info": meta}

    if not v.boolean("stream"):
        steps = [s async for s in run.steps()]
        return web.Response(body=orjson.dumps(reply(decode(shown(run.tokens, True)), True)),
                            content_type="application/json")
    resp = await _prepare(request)
    tail = TextTail(decode)
    shown_n = 0
    async for s, last in with_last(run):
        steps.append(s)
        if not last and len(steps) % SGLANG_STREAM_INTERVAL == 0:
            new = shown([x.token for x in steps], False)
            tail.add(new[shown_n:])
            shown_n = len(new)
            await resp.write(sse_event(reply(tail.text, False)))
    final_ids = shown(run.tokens, True)
    tail.add(final_ids[shown_n:])
    tail.flush()
    await resp.write(sse_event(reply(tail.text, True)))
    return await _done(resp)


def _default_stops(shared: Shared, req: IdRequest) -> set[int]:
    if shared.foreign is not None:
        sid = shared.foreign.stop_id(req.stop_ids)
        return set() if sid is None else {sid}
    return {shared.engine.tok.eot_id}


def _sglang_finish(run: Run, ids: list[int]) -> dict[str, Any]:
    if run.finish_reason == "stop":
        return {"type": "stop", "matched": ids[-1] if ids else None}
    return {"type": "length", "length": len(ids)}

