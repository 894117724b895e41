"""Loopback model servers replaying the reply shapes of vLLM's ``/v1/completions`` and
``/inference/v1/generate`` and SGLang's ``/generate`` (shapes per shared REFERENCE.md).

A mock by necessity: no vLLM or SGLang can run here. Each 'samples' the ids it is scripted
with, checks the request carries what token-in/token-out needs, and can be told to answer
with one logprob too few (``short_logprobs``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web


@dataclass
class Script:
    """What the fake samples next: ids, their text, how it ends."""

    ids: list[int]
    text: str = ""
    finish: str = "stop"
    short_logprobs: bool = False
    requests: list[dict[str, Any]] = field(default_factory=list)
    #: When set, ``policy(prompt ids) -> (ids, text, finish)`` picks what is sampled for
    #: each request (a deterministic 'model' reading the prompt), instead of the fields.
    policy: Callable[[list[int]], tuple[list[int], str, str]] | None = None

    def sample(self, prompt: list[int]) -> None:
        """Run the policy (if any) for ``prompt``."""
        if self.policy is not None:
            self.ids, self.text, self.finish = self.policy(prompt)


SCRIPT = web.AppKey("script", Script)


def _lps(n: int, short: bool) -> list[float]:
    return [-0.5 - 0.01 * i for i in range(n - (1 if short else 0))]


def _check_common(body: dict[str, Any], ids_key: str) -> None:
    prompt = body[ids_key]
    assert isinstance(prompt, list) and all(isinstance(i, int) for i in prompt), ids_key


def _sse(chunks: list[dict[str, Any]]) -> bytes:
    return b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


async def _completions(req: web.Request) -> web.StreamResponse:
    s: Script = req.app[SCRIPT]
    body = await req.json()
    s.requests.append(body)
    _check_common(body, "prompt")
    s.sample(body["prompt"])
    assert body["return_token_ids"] and body["return_tokens_as_token_ids"]
    assert body["skip_special_tokens"] is False and body["stop_token_ids"]
    assert isinstance(body["max_tokens"], int) and isinstance(body["logprobs"], int)
    lps = _lps(len(s.ids), s.short_logprobs)
    toks = [f"token_id:{i}" for i in s.ids]
    if not body.get("stream"):
        return web.json_response({
            "id": "cmpl-1", "object": "text_completion", "model": body.get("model", "m"),
            "choices": [{"index": 0, "text": s.text, "token_ids": s.ids,
                         "prompt_token_ids": body["prompt"], "finish_reason": s.finish,
                         "stop_reason": None,
                         "logprobs": {"tokens": toks[:len(lps)], "token_logprobs": lps,
                                      "top_logprobs": [{t: lp} for t, lp in
                                                       zip(toks, lps, strict=False)],
                                      "text_offset": list(range(len(lps)))}}],
            "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": len(s.ids),
                      "total_tokens": len(body["prompt"]) + len(s.ids)}})
    chunks = []
    for j, i in enumerate(s.ids):
        ch: dict[str, Any] = {"index": 0, "text": s.text if j == 0 else "", "token_ids": [i],
                              "finish_reason": s.finish if j == len(s.ids) - 1 else None,
                              "logprobs": {"tokens": [toks[j]],
                                           "token_logprobs": lps[j:j + 1],
                                           "text_offset": [j]}}
        if j == 0:
            ch["prompt_token_ids"] = body["prompt"]
        chunks.append({"id": "cmpl-1", "object": "text_completion", "choices": [ch]})
    chunks.append({"id": "cmpl-1", "object": "text_completion", "choices": [],
                   "usage": {"prompt_tokens": len(body["prompt"]),
                             "completion_tokens": len(s.ids)}})
    return web.Response(body=_sse(chunks), content_type="text/event-stream")


async def _generate(req: web.Request) -> web.StreamResponse:
    s: Script = req.app[SCRIPT]
    body = await req.json()
    s.requests.append(body)
    _check_common(body, "token_ids")
    sp = body["sampling_params"]
    assert isinstance(sp["max_tokens"], int) and sp["skip_special_tokens"] is False
    lps = _lps(len(s.ids), s.short_logprobs)
    content = [{"token": f"token_id:{i}", "logprob": lp, "top_logprobs": []}
               for i, lp in zip(s.ids, lps, strict=False)]
    return web.json_response({
        "request_id": body.get("request_id", "r"),
        "choices": [{"index": 0, "token_ids": s.ids, "logprobs": {"content": content},
                     "finish_reason": s.finish}],
        "usage": {"prompt_tokens": len(body["token_ids"]), "completion_tokens": len(s.ids)}})


async def _sglang(req: web.Request) -> web.StreamResponse:
    s: Script = req.app[SCRIPT]
    body = await req.json()
    s.requests.append(body)
    _check_common(body, "input_ids")
    assert body["return_logprob"] is True and body["logprob_start_len"] == -1
    sp = body["sampling_params"]
    assert isinstance(sp["max_new_tokens"], int) and sp["no_stop_trim"] is True
    lps = _lps(len(s.ids), s.short_logprobs)

    def reply(n: int, done: bool) -> dict[str, Any]:
        return {"text": s.text if done else s.text[:n], "output_ids": s.ids[:n],
                "meta_info": {
                    "id": "rid", "prompt_tokens": len(body["input_ids"]),
                    "completion_tokens": n,
                    "finish_reason": ({"type": s.finish, "matched": s.ids[-1]}
                                      if done else None),
                    "output_token_logprobs": [[lp, i, None]
                                              for lp, i in zip(lps[:n], s.ids[:n], strict=False)]}}

    if not body.get("stream"):
        return web.json_response(reply(len(s.ids), True))
    # Cumulative chunks, as SGLang streams by default.
    chunks = [reply(n, n == len(s.ids)) for n in range(1, len(s.ids) + 1)]
    return web.Response(body=_sse(chunks), content_type="text/event-stream")


ROUTES: dict[str, Callable[[web.Request], Any]] = {
    "/v1/completions": _completions, "/inference/v1/generate": _generate,
    "/generate": _sglang}


async def start_fake(script: Script) -> tuple[web.AppRunner, str]:
    """Serve all three routes on 127.0.0.1; returns (runner, base URL)."""
    app = web.Application()
    app[SCRIPT] = script
    for path, h in ROUTES.items():
        app.router.add_post(path, h)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}"
