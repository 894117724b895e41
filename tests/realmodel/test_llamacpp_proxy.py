"""The proxy token-in/token-out over the real llama-server (``--upstream-api llamacpp``,
``--tokenizer`` the SmolLM2 GGUF): an unmodified openai SDK multi-turn loop, streamed and
not. A tap between the proxy and the server keeps what went over the wire; the trace's
sampled ids and logprobs equal the server's ``tokens`` and ``log(prob)`` (as float32, bit
for bit), every prompt extends the previous prompt + its sampled ids, and the session's
mismatch report is 0."""

from __future__ import annotations

import json
import math
from typing import Any

import aiohttp
import numpy as np
import openai
import pytest
from aiohttp import web

from tracewire.compose import make_upstream
from tracewire.proxy import Proxy

from .conftest import LlamaServerProc

TURNS = 4


class Tap:
    """A loopback pass-through of ``/completion`` that records each request body and the
    server's answer (the JSON object, or the list of streamed ``data:`` objects)."""

    def __init__(self, engine: str) -> None:
        self.engine = engine
        self.calls: list[tuple[dict[str, Any], Any]] = []
        self.url = ""

    async def _forward(self, req: web.Request) -> web.StreamResponse:
        raw = await req.read()
        body = json.loads(raw)
        async with self._http.post(self.engine + "/completion", data=raw,
                                   headers={"Content-Type": "application/json"}) as r:
            data = await r.read()
            ctype = r.content_type
        if body.get("stream"):
            seen = [json.loads(line[5:]) for line in data.split(b"\n")
                    if line.startswith(b"data:") and line[5:].strip() != b"[DONE]"]
        else:
            seen = json.loads(data)
        self.calls.append((body, seen))
        return web.Response(body=data, content_type=ctype)

    async def __aenter__(self) -> Tap:
        self._http = aiohttp.ClientSession()
        app = web.Application(client_max_size=1 << 28)
        app.router.add_post("/completion", self._forward)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._runner.cleanup()
        await self._http.close()


def _wire(seen: Any) -> tuple[list[int], list[float]]:
    """(ids, logprobs) as llama-server sent them, read without tracewire's parser."""
    if isinstance(seen, list):
        entries = [c["completion_probabilities"][0] for c in seen if c.get("tokens")]
        return [t for c in seen for t in c.get("tokens", [])], [math.log(e["prob"])
                                                               for e in entries]
    return seen["tokens"], [math.log(e["prob"]) for e in seen["completion_probabilities"]]


@pytest.mark.parametrize("stream", [False, True])
async def test_openai_loop_through_the_proxy_is_token_exact(llama_server: LlamaServerProc,
                                                            stream: bool) -> None:
    async with Tap(llama_server.url) as tap:
        up = make_upstream(tap.url, tokenizer=str(llama_server.gguf), upstream_api="llamacpp",
                           model="smollm2")
        async with Proxy(up) as proxy:
            s = proxy.create_session()
            client = openai.AsyncOpenAI(base_url=s.base_url, api_key=s.secret, max_retries=0)
            msgs: list[Any] = [{"role": "user", "content": "Name a fruit."}]
            try:
                for t in range(TURNS):
                    kw: dict[str, Any] = {"model": "smollm2", "messages": msgs,
                                          "max_tokens": 24, "temperature": 0.8, "seed": t}
                    if stream:
                        text = ""
                        async for ch in await client.chat.completions.create(stream=True,
                                                                             **kw):
                            if ch.choices:
                                text += ch.choices[0].delta.content or ""
                    else:
                        r = await client.chat.completions.create(**kw)
                        text = r.choices[0].message.content or ""
                    msgs += [{"role": "assistant", "content": text},
                             {"role": "user", "content": f"And another one ({t})?"}]
            finally:
                await client.close()
            await proxy.finish_session(s.id)
            trace = s.trace
    assert len(tap.calls) == TURNS
    assert all(c.error is None for c in trace.calls), [c.error for c in trace.calls]
    sampled: list[int] = []
    lps: list[float] = []
    prev: list[int] | None = None
    for body, seen in tap.calls:
        ids, wire_lps = _wire(seen)
        if prev is not None:
            assert body["prompt"][:len(prev)] == prev  # the sampled ids kept verbatim
        prev = body["prompt"] + ids
        sampled += ids
        lps += wire_lps
    br = trace.branch()
    assert br.ids[br.mask == 1].tolist() == sampled
    assert np.array_equal(br.logprobs[br.mask == 1], np.asarray(lps, dtype=np.float32))
    assert trace.info["tito_mismatch"] == 0, trace.info["tito"]
    assert trace.info["tito"]["rerenders"] == {}
