"""A real engine behind the chat pass-through: streamed calls through the proxy record
llama-server's own usage report, and a client that did not ask for usage gets no usage
chunk (the proxy asked the engine for it on its behalf)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
from aiohttp import web

from tracewire.proxy import Proxy

from ..proxy.test_stream_usage import Tap
from .conftest import LlamaServerProc


@pytest.fixture
async def tapped(llama_server: LlamaServerProc) -> AsyncIterator[tuple[Tap, Proxy]]:
    tap = Tap(llama_server.url + "/v1")
    app = web.Application()
    app.router.add_post("/v1/chat/completions", tap.chat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        async with Proxy(f"http://127.0.0.1:{runner.addresses[0][1]}/v1") as p:
            yield tap, p
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("ask", [False, True])
async def test_llama_server_stream_usage(tapped: tuple[Tap, Proxy], ask: bool) -> None:
    tap, proxy = tapped
    s = proxy.create_session()
    client = openai.AsyncOpenAI(base_url=s.base_url, api_key=s.secret, max_retries=0)
    kw: dict[str, Any] = {"stream_options": {"include_usage": True}} if ask else {}
    chunks = [c async for c in await client.chat.completions.create(
        model="smollm", messages=[{"role": "user", "content": "What is 2+3?"}],
        max_tokens=8, temperature=0, stream=True, **kw)]  # type: ignore[arg-type]
    await client.close()
    (call,) = s.trace.calls
    assert call.error is None
    assert tap.asked == [{"include_usage": True}]
    (upstream_usage,) = tap.usage
    assert call.usage == {k: v for k, v in upstream_usage.items() if isinstance(v, int)}
    assert call.usage["prompt_tokens"] > 0 and 0 < call.usage["completion_tokens"] <= 8
    got = [c.usage for c in chunks if c.usage is not None]
    if ask:
        assert [u.prompt_tokens for u in got] == [call.usage["prompt_tokens"]]
    else:
        assert got == [] and all(c.choices for c in chunks)
