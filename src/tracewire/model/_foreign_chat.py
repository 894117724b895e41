"""``/v1/completions`` and ``/v1/chat/completions`` when serving a foreign tokenizer directory.

Completions take a text or id prompt; chat renders ``messages`` (+ ``tools``) with the
directory's own chat template (``tracewire.tokens.ChatTokenizer``: transformers, offline, no
torch). Both sample with :class:`~._runs.Run` (see ``_foreign.py``) and answer vLLM's shapes:
``token_ids``/``prompt_token_ids`` (streamed: prompt ids on the first chunk), legacy or chat
``logprobs`` with ``token_id:N`` tokens when asked. The stop id is in ``token_ids`` and the
logprobs, not in the text. The completion is plain text: chat answers carry no tool calls.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Mapping
from typing import Any

import orjson
from aiohttp import web

from .._errors import ModelError
from ._chat import Shared, sse_event
from ._foreign import ForeignModel
from ._protocol import MAX_N, MAX_TOP_LOGPROBS, MODEL_NAME, RequestError, Validated
from ._runs import (
    IdRequest,
    Run,
    TextTail,
    check_prompt_ids,
    split_probability,
    stop_token_ids,
    with_last,
)

__all__ = ["foreign_chat", "foreign_completions", "render_foreign"]


async def render_foreign(fm: ForeignModel, messages: Any, tools: Any,
                         add_generation_prompt: bool = True) -> list[int]:
    """Prompt ids of ``messages`` under the directory's chat template (in a worker thread)."""
    if not isinstance(messages, list) or not messages or not all(
            isinstance(m, Mapping) for m in messages):
        raise RequestError("'messages' must be a non-empty list of objects", "messages")
    if tools is not None and not isinstance(tools, list):
        raise RequestError("'tools' must be a list", "tools")

    def render() -> list[int]:
        from ..tokens import TemplateError, chat_messages

        ct = fm.chat_tokenizer()
        try:
            text = ct.render(chat_messages([dict(m) for m in messages]), tools or None,
                             add_generation_prompt=add_generation_prompt)
        except TemplateError as exc:
            raise RequestError(str(exc), "messages") from exc
        return list(ct.encode(text))

    try:
        return await asyncio.to_thread(render)
    except RequestError:
        raise
    except ModelError as exc:
        raise RequestError(str(exc), "messages") from exc


def _token(fm: ForeignModel, as_ids: bool, t: int) -> str:
    return f"token_id:{t}" if as_ids else fm.token_text(t)


def _stops(fm: ForeignModel, stops: tuple[int, ...]) -> set[int]:
    sid = fm.stop_id(stops)
    return set(stops) | (set() if sid is None else {sid})


def _usage(prompt: list[int], done: int) -> dict[str, int]:
    return {"prompt_tokens": len(prompt), "completion_tokens": done,
            "total_tokens": len(prompt) + done}


def _include_usage(v: Validated) -> bool:
    opts = v.body.get("stream_options")
    if opts is not None and not isinstance(opts, Mapping):
        raise RequestError("'stream_options' must be an object", "stream_options")
    return bool(opts and opts.get("include_usage"))


async def _prepare(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                       "Cache-Control": "no-cache"})
    await resp.prepare(request)
    return resp


async def foreign_completions(request: web.Request, shared: Shared,
                              body: Any) -> web.StreamResponse:
    """Legacy completions over the foreign vocabulary (no ``echo``)."""
    fm = shared.foreign
    assert fm is not None
    v = Validated(body)
    v.model()
    raw = v.body.get("prompt")
    if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], str | list):
        raw = raw[0]  # a batch of one
    if isinstance(raw, str) and raw:
        prompt = await asyncio.to_thread(fm.encode_prompt, raw)
    else:
        prompt = check_prompt_ids(shared, raw, "prompt")
    if v.boolean("echo"):
        raise RequestError("'echo' is not supported over a foreign tokenizer (prompt "
                           "logprobs are not defined there)", "echo")
    n = v.integer("n", 1, 1, MAX_N) or 1
    params = v.sampling(len(prompt), default_max=16, max_model_len=shared.max_model_len)
    want = v.integer("logprobs", None, 0, MAX_TOP_LOGPROBS)
    params.top_logprobs = want or 0
    stops = stop_token_ids(shared, v.body, "stop_token_ids")
    v.boolean("skip_special_tokens")  # accepted; the stop id is never in the text
    req = IdRequest(prompt, params, stops, split_probability(shared, v.extension()), v.seed())
    as_ids = v.boolean("return_tokens_as_token_ids")
    return_ids = v.boolean("return_token_ids")
    policy = shared.policy_for(request)
    ends = _stops(fm, stops)
    head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
            "created": int(time.time()), "model": MODEL_NAME}

    def logprobs(ids: list[int], lps: list[float], tops: list[list[tuple[int, float]]],
                 offset: int) -> dict[str, Any] | None:
        if want is None:
            return None
        tokens = [_token(fm, as_ids, t) for t in ids]
        offsets = []
        for t in ids:
            offsets.append(offset)
            offset += len(fm.token_text(t))
        return {"tokens": tokens, "token_logprobs": lps, "text_offset": offsets,
                "top_logprobs": ([{_token(fm, as_ids, a): lp for a, lp in top} for top in tops]
                                 if want else None)}

    runs = [Run(shared, req, i, policy) for i in range(n)]
    if not v.boolean("stream"):
        choices = []
        for i, run in enumerate(runs):
            steps = [s async for s in run.steps()]
            ids = run.tokens
            shown = ids[:-1] if run.finish_reason == "stop" and ids and ids[-1] in ends else ids
            c: dict[str, Any] = {
                "index": i, "text": fm.decode(shown), "finish_reason": run.finish_reason,
                "logprobs": logprobs(ids, [s.logprob for s in steps], [s.top for s in steps],
                                     0)}
            if return_ids:
                c["prompt_token_ids"], c["token_ids"] = prompt, ids
            choices.append(c)
        out = {**head, "choices": choices,
               "usage": _usage(prompt, sum(len(r.tokens) for r in runs))}
        return web.Response(body=orjson.dumps(out), content_type="application/json")
    usage = _include_usage(v)
    resp = await _prepare(request)
    first = True
    for i, run in enumerate(runs):
        tail = TextTail(fm.decode)
        async for s, last in with_last(run):
            finish = run.finish_reason if last else None
            at = len(tail.text)
            text = "" if finish == "stop" and s.token in ends else tail.add([s.token])
            if last:
                text += tail.flush()
            c = {"index": i, "text": text, "finish_reason": finish,
                 "logprobs": logprobs([s.token], [s.logprob], [s.top], at)}
            if return_ids:
                c["token_ids"] = [s.token]
                if first:
                    c["prompt_token_ids"] = prompt
            first = False
            await resp.write(sse_event({**head, "choices": [c]}))
    if usage:
        await resp.write(sse_event({**head, "choices": [],
                               "usage": _usage(prompt, sum(len(r.tokens) for r in runs))}))
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


async def foreign_chat(request: web.Request, shared: Shared, body: Any) -> web.StreamResponse:
    """Chat completions rendered with the directory's chat template; plain-text answers."""
    fm = shared.foreign
    assert fm is not None
    v = Validated(body)
    v.model()
    prompt = await render_foreign(fm, v.body.get("messages"), v.body.get("tools"))
    n = v.integer("n", 1, 1, MAX_N) or 1
    params = v.sampling(len(prompt), default_max=1024, max_model_len=shared.max_model_len)
    want_lp = v.boolean("logprobs")
    top = v.integer("top_logprobs", 0, 0, MAX_TOP_LOGPROBS) or 0
    params.top_logprobs = top if want_lp else 0
    stops = stop_token_ids(shared, v.body, "stop_token_ids")
    req = IdRequest(prompt, params, stops, split_probability(shared, v.extension()), v.seed())
    as_ids = v.boolean("return_tokens_as_token_ids")
    return_ids = v.boolean("return_token_ids")
    policy = shared.policy_for(request)
    ends = _stops(fm, stops)
    head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()),
            "model": MODEL_NAME}

    def entry(t: int, lp: float, alts: list[tuple[int, float]]) -> dict[str, Any]:
        return {"token": _token(fm, as_ids, t), "logprob": lp, "bytes": None,
                "top_logprobs": [{"token": _token(fm, as_ids, a), "logprob": x, "bytes": None}
                                 for a, x in alts]}

    runs = [Run(shared, req, i, policy) for i in range(n)]
    if not v.boolean("stream"):
        choices = []
        for i, run in enumerate(runs):
            steps = [s async for s in run.steps()]
            ids = run.tokens
            shown = ids[:-1] if run.finish_reason == "stop" and ids and ids[-1] in ends else ids
            c: dict[str, Any] = {
                "index": i, "message": {"role": "assistant", "content": fm.decode(shown)},
                "finish_reason": run.finish_reason,
                "logprobs": ({"content": [entry(s.token, s.logprob, s.top) for s in steps]}
                             if want_lp else None)}
            if return_ids:
                c["token_ids"] = ids
            choices.append(c)
        out: dict[str, Any] = {**head, "object": "chat.completion", "choices": choices,
                               "usage": _usage(prompt, sum(len(r.tokens) for r in runs))}
        if return_ids:
            out["prompt_token_ids"] = prompt
        return web.Response(body=orjson.dumps(out), content_type="application/json")
    usage = _include_usage(v)
    resp = await _prepare(request)
    base = {**head, "object": "chat.completion.chunk"}
    for i, run in enumerate(runs):
        first: dict[str, Any] = {**base, "choices": [{"index": i, "finish_reason": None,
                                                      "delta": {"role": "assistant",
                                                                "content": ""}}]}
        if return_ids:
            first["choices"][0]["token_ids"] = []
            if i == 0:
                first["prompt_token_ids"] = prompt
        await resp.write(sse_event(first))
        tail = TextTail(fm.decode)
        async for s, last in with_last(run):
            finish = run.finish_reason if last else None
            text = "" if finish == "stop" and s.token in ends else tail.add([s.token])
            if last:
                text += tail.flush()
            ch: dict[str, Any] = {"index": i, "delta": {"content": text} if text else {},
                                  "finish_reason": finish,
                                  "logprobs": ({"content": [entry(s.token, s.logprob, s.top)]}
                                               if want_lp else None)}
            if return_ids:
                ch["token_ids"] = [s.token]
            await resp.write(sse_event({**base, "choices": [ch]}))
    if usage:
        await resp.write(sse_event({**base, "choices": [],
                               "usage": _usage(prompt, sum(len(r.tokens) for r in runs))}))
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp
