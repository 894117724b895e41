"""A pass-through upstream whose reply carries ids the trace cannot hold (below 0, at or
above 2**31): the harness gets a 502 with a JSON error, streamed or not, the call is
recorded as failed (the branch's sample aborted) and nothing of the reply is recorded.

The upstream is a loopback vLLM-shaped chat fake (a mock by necessity: no vLLM here); the
proxy, its sockets and the SDK-free aiohttp harness are real.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from tracewire.proxy import Proxy
from tracewire.samples import SampleStatus, assemble

OK_IDS = [5, 6]


def _choice(ids: list[int], stream: bool) -> dict[str, Any]:
    key = "delta" if stream else "message"
    return {"index": 0, key: {"role": "assistant", "content": "x"}, "finish_reason": "stop",
            "token_ids": ids, "logprobs": {"content": [
                {"token": f"token_id:{i}", "logprob": -0.5} for i in ids]}}


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[str, list[list[int]]]]:
    script: list[list[int]] = []  # the ids each request answers, in order

    async def chat(req: web.Request) -> web.StreamResponse:
        body = await req.json()
        ids = script.pop(0)
        if body.get("stream"):
            chunk = {"id": "c", "object": "chat.completion.chunk", "model": "m",
                     "prompt_token_ids": [1, 2], "choices": [_choice(ids, True)]}
            return web.Response(body=b"data: " + orjson.dumps(chunk) + b"\n\ndata: [DONE]\n\n",
                                content_type="text/event-stream")
        return web.json_response({"id": "c", "object": "chat.completion", "model": "m",
                                  "prompt_token_ids": [1, 2],
                                  "choices": [_choice(ids, False)]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/v1", script
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("bad", [-1, 2**31, 2**40])
async def test_out_of_range_reply_ids_are_a_recorded_502(
        upstream: tuple[str, list[list[int]]], stream: bool, bad: int) -> None:
    url, script = upstream
    script += [OK_IDS, [5, bad]]
    async with Proxy(url) as proxy, aiohttp.ClientSession() as http:
        s = proxy.create_session()
        msgs: list[dict[str, Any]] = [{"role": "user", "content": "a"}]
        for expect in (200, 502):
            async with http.post(s.base_url + "/chat/completions",
                                 headers={"Authorization": f"Bearer {s.secret}"},
                                 json={"model": "m", "messages": msgs, "stream": stream}) as r:
                raw = await r.read()
            assert r.status == expect, raw
            if expect == 200:
                msgs += [{"role": "assistant", "content": "x"}, {"role": "user", "content": "b"}]
        err = orjson.loads(raw)["error"]["message"]
        assert "outside [0, 2**31)" in err
        calls = s.trace.calls
        assert [c.error is None for c in calls] == [True, False]
        assert bad not in s.trace.branch().ids.tolist()
        assert len(s.trace.nodes) == 2  # user a and the first answer: nothing of the bad one
        samples = assemble(s.trace)
        assert samples and all(x.status == SampleStatus.ABORTED for x in samples)
