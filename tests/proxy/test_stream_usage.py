"""Streamed chat calls fill ``Call.usage`` with what the upstream reported, whether or not
the harness asked for ``stream_options.include_usage``, and a harness that did not ask gets
the stream it would have got without the proxy (no usage chunk, no ``usage: null``).

The harnesses are the real SDKs (openai Python, openai TypeScript under node, the Agents
SDK's chat model, streamed); the upstream is the built-in model behind a pass-through tap
that keeps the usage the model reported, so "equal to the upstream's" is compared as sent.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import pytest
from aiohttp import web

from tracewire.model import MODEL_NAME, ModelServer
from tracewire.proxy import Proxy, ProxyConfig

from .fake_upstream import Fake, serve


@dataclass
class Tap:
    """Forwards chat requests to the model; keeps what was asked and the usage it sent."""

    target: str
    asked: list[Any] = field(default_factory=list)
    usage: list[dict[str, int]] = field(default_factory=list)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.asked.append(orjson.loads(body).get("stream_options"))
        async with aiohttp.ClientSession() as c, c.post(
                self.target + "/chat/completions", data=body,
                headers={"Content-Type": "application/json"}) as r:
            resp = web.StreamResponse(status=r.status, headers={
                "Content-Type": r.headers.get("Content-Type", "application/json")})
            await resp.prepare(request)
            async for line in r.content:
                if line.startswith(b"data: {"):
                    u = orjson.loads(line[6:]).get("usage")
                    if isinstance(u, dict):
                        self.usage.append(u)
                await resp.write(line)
            await resp.write_eof()
            return resp


@pytest.fixture
async def tap() -> AsyncIterator[tuple[Tap, str]]:
    async with ModelServer() as model:
        t = Tap(model.base_url)
        app = web.Application()
        app.router.add_post("/v1/chat/completions", t.chat)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        try:
            yield t, f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
        finally:
            await runner.cleanup()


@pytest.fixture
async def proxy(tap: tuple[Tap, str]) -> AsyncIterator[Proxy]:
    async with Proxy(tap[1]) as p:
        yield p


def recorded(proxy: Proxy, session_id: str) -> list[dict[str, int]]:
    trace = proxy.registry.get(session_id).trace
    assert trace.calls and all(c.error is None for c in trace.calls)
    return [dict(c.usage) for c in trace.calls]


def check_usage(tap: Tap, got: list[dict[str, int]]) -> None:
    # The upstream was asked every time, and each call recorded exactly what it sent.
    assert tap.asked and all(isinstance(a, dict) and a.get("include_usage") for a in tap.asked)
    assert got == tap.usage, (got, tap.usage)
    assert all(u["prompt_tokens"] > 0 and u["completion_tokens"] > 0 for u in got)


MESSAGES = [{"role": "user", "content": "say something"}]


@pytest.mark.parametrize("ask", [False, True])
async def test_openai_python_stream(tap: tuple[Tap, str], proxy: Proxy, ask: bool) -> None:
    s = proxy.create_session()
    client = openai.AsyncOpenAI(base_url=s.base_url, api_key=s.secret, max_retries=0)
    kw: dict[str, Any] = {"stream_options": {"include_usage": True}} if ask else {}
    chunks = [c async for c in await client.chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, max_tokens=12, stream=True, **kw)]  # type: ignore[arg-type]
    await client.close()
    got = recorded(proxy, s.id)
    check_usage(tap[0], got)
    with_usage = [c for c in chunks if c.usage is not None]
    if ask:
        # What the harness asked for, as the upstream sent it: one last usage-only chunk.
        assert len(with_usage) == 1 and with_usage[0] is chunks[-1]
        assert not chunks[-1].choices
        assert with_usage[0].usage.model_dump(exclude_none=True) == got[0]
    else:
        assert with_usage == [] and all(c.choices for c in chunks)


async def test_unasked_stream_bytes_carry_no_usage(tap: tuple[Tap, str], proxy: Proxy) -> None:
    # The built-in model marks every chunk "usage": null once asked; the harness that did
    # not ask sees none of it, only the proxy's record has the usage.
    s = proxy.create_session()
    body = {"model": MODEL_NAME, "messages": MESSAGES, "max_tokens": 12, "stream": True,
            "stream_options": {"continuous_usage_stats": False}}
    async with aiohttp.ClientSession() as c, c.post(
            s.base_url + "/chat/completions", json=body,
            headers={"Authorization": f"Bearer {s.secret}"}) as r:
        raw = await r.read()
    assert r.status == 200 and raw.endswith(b"data: [DONE]\n\n")
    assert b"usage" not in raw
    check_usage(tap[0], recorded(proxy, s.id))
    # The harness's other stream options went upstream unchanged next to include_usage.
    assert tap[0].asked == [{"continuous_usage_stats": False, "include_usage": True}]


@pytest.mark.parametrize("token_fields", [True, False])
async def test_relayed_chunks_parse_to_the_same_without_usage(tap: tuple[Tap, str],
                                                            token_fields: bool) -> None:
    # Without token fields the proxy relays the model's lines as they are, cutting only
    # the usage marker; with them it re-renders: the harness reads the same either way.
    config = ProxyConfig() if token_fields else ProxyConfig(token_fields={})
    async with Proxy(tap[1], config=config) as p:
        s = p.create_session()
        body = {"model": MODEL_NAME, "messages": MESSAGES, "max_tokens": 12, "stream": True,
                "seed": 3}
        async with aiohttp.ClientSession() as c, c.post(
                s.base_url + "/chat/completions", json=body,
                headers={"Authorization": f"Bearer {s.secret}"}) as r:
            raw = await r.read()
        got = recorded(p, s.id)
    lines = [ln[6:] for ln in raw.split(b"\n") if ln.startswith(b"data: {")]
    chunks = [orjson.loads(ln) for ln in lines]
    assert chunks and all("usage" not in c and c["choices"] for c in chunks)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    # The model, asked directly with the same seed and no usage, says the same.
    async with aiohttp.ClientSession() as c, c.post(
            tap[0].target + "/chat/completions", json=body) as r:
        direct = [orjson.loads(ln[6:]) for ln in (await r.read()).split(b"\n")
                  if ln.startswith(b"data: {")]
    assert text == "".join(d["choices"][0]["delta"].get("content") or "" for d in direct)
    assert [c["choices"][0].get("finish_reason") for c in chunks] == \
        [d["choices"][0].get("finish_reason") for d in direct]
    assert got == tap[0].usage


async def test_fake_upstream_usage_chunk_is_recorded_not_relayed() -> None:
    # A second upstream (vLLM's shapes) that sends usage only in the usage-only chunk.
    fake = Fake()
    runner, url = await serve(fake)
    try:
        async with Proxy(url) as p:
            s = p.create_session()
            client = openai.AsyncOpenAI(base_url=s.base_url, api_key=s.secret, max_retries=0)
            chunks = [c async for c in await client.chat.completions.create(
                model="fake-model", messages=MESSAGES, stream=True)]  # type: ignore[arg-type]
            await client.close()
            (call,) = p.registry.get(s.id).trace.calls
    finally:
        await runner.cleanup()
    (turn,) = fake.log
    assert call.usage == {"prompt_tokens": len(turn.prompt),
                          "completion_tokens": len(turn.completion),
                          "total_tokens": len(turn.prompt) + len(turn.completion)}
    assert fake.requests[0]["stream_options"] == {"include_usage": True}
    assert all(c.choices and c.usage is None for c in chunks)


async def test_agents_sdk_chat_stream(tap: tuple[Tap, str], proxy: Proxy) -> None:
    import agents  # openai-agents, a dev dependency

    agents.set_tracing_disabled(True)  # its exporter would try the vendor's host
    s = proxy.create_session()
    client = openai.AsyncOpenAI(base_url=s.base_url, api_key=s.secret, max_retries=0)
    model = agents.OpenAIChatCompletionsModel(model=MODEL_NAME, openai_client=client)
    agent = agents.Agent(name="a", instructions="Be brief.", model=model,
                         model_settings=agents.ModelSettings(max_tokens=12))
    result = agents.Runner.run_streamed(agent, "say something")
    async for _ in result.stream_events():
        pass
    await client.close()
    got = recorded(proxy, s.id)
    check_usage(tap[0], got)
    assert result.is_complete


TS_CLIENT = r"""
const OpenAI = require("openai");
const [base, key, model, ask] = process.argv.slice(2);
(async () => {
  const client = new OpenAI({ baseURL: base, apiKey: key, maxRetries: 0 });
  const extra = ask === "1" ? { stream_options: { include_usage: true } } : {};
  const stream = await client.chat.completions.create({
    model, messages: [{ role: "user", content: "say something" }], max_tokens: 12,
    stream: true, ...extra });
  const chunks = [];
  for await (const c of stream) chunks.push(c);
  console.log(JSON.stringify(chunks));
})().catch((e) => { console.error(String(e)); process.exit(1); });
"""


@pytest.fixture(scope="module")
def node_openai() -> Path:
    """A directory whose ``node_modules`` holds the openai TypeScript SDK (npm installs it
    into the user's cache once; ``.ci/run`` does it before the tests)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        if os.environ.get("TRACEWIRE_REQUIRE_AGENTS") == "1":
            pytest.fail("node/npm are required here (TRACEWIRE_REQUIRE_AGENTS=1)")
        pytest.skip("node and npm are not installed")
    root = Path(os.environ.get("TRACEWIRE_NODE_OPENAI",
                               Path.home() / ".cache" / "tracewire" / "node-openai"))
    if not (root / "node_modules" / "openai" / "package.json").is_file():
        root.mkdir(parents=True, exist_ok=True)
        res = subprocess.run([npm, "install", "--no-audit", "--no-fund", "openai"], cwd=root,
                             capture_output=True, text=True, timeout=300, check=False)
        assert res.returncode == 0, res.stderr[-2000:]
    return root


@pytest.mark.parametrize("ask", [False, True])
async def test_openai_typescript_stream(tap: tuple[Tap, str], proxy: Proxy, node_openai: Path,
                                        tmp_path: Path, ask: bool) -> None:
    import asyncio

    script = tmp_path / "client.js"
    script.write_text(TS_CLIENT)
    s = proxy.create_session()
    proc = await asyncio.create_subprocess_exec(
        "node", str(script), s.base_url, s.secret, MODEL_NAME, "1" if ask else "0",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "NODE_PATH": str(node_openai / "node_modules")})
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()[-2000:]
    chunks = json.loads(out)
    got = recorded(proxy, s.id)
    check_usage(tap[0], got)
    with_usage = [c for c in chunks if c.get("usage")]
    if ask:
        assert [c["usage"] for c in with_usage] == got and not chunks[-1]["choices"]
    else:
        assert with_usage == [] and all("usage" not in c and c["choices"] for c in chunks)
