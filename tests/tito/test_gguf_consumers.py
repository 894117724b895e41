"""A GGUF file works wherever a tokenizer directory does: the built-in model server samples
over it (chat rendered with its template), the viewer resolves it from a run's config and
builds its vocabulary table, and the proxy command serves token-in/token-out with it (a real
subprocess against the fake vLLM)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import aiohttp
import openai
import orjson

from tracewire.model import ModelServer
from tracewire.tito import ChatTokenizer, PromptBuilder
from tracewire.tito.fixtures import build_gguf_file
from tracewire.view._vocab import VocabTable, resolve_tokenizer

from .e2e_harness import Policy
from .fake_servers import Script, start_fake


async def test_model_server_samples_over_a_gguf_file(tmp_path: Path) -> None:
    path = build_gguf_file(tmp_path / "q.gguf", "qwen25")
    ct = ChatTokenizer(path)
    msgs = [{"role": "user", "content": "hi"}]
    async with ModelServer(tokenizer=path) as srv:
        client = openai.AsyncOpenAI(base_url=srv.base_url, api_key="x", max_retries=0)
        r = await client.chat.completions.create(
            model="tracewire-tiny", messages=msgs, seed=1, max_tokens=20,  # type: ignore[arg-type]
            extra_body={"return_token_ids": True})
        await client.close()
    d = r.model_dump()
    assert d["prompt_token_ids"] == PromptBuilder(ct).render_full(msgs).ids
    ids = d["choices"][0]["token_ids"]
    assert ids and all(0 <= i < ct.vocab_size for i in ids)


def test_viewer_resolves_a_gguf_tokenizer(tmp_path: Path) -> None:
    path = build_gguf_file(tmp_path / "l.gguf", "llama3")
    ref = resolve_tokenizer({"config": {"tokenizer": str(path)}}, tmp_path)
    assert ref.kind == "dir" and ref.path == path.resolve()
    table = orjson.loads(VocabTable(ref).body())
    ct = ChatTokenizer(path)
    assert table["known"] and len(table["pieces"]) == ct.vocab_size
    assert table["pieces"][ct.special["<|eot_id|>"]] == "<|eot_id|>"
    # A path that is neither a directory nor a GGUF file stays ids-only.
    (tmp_path / "x.bin").write_bytes(b"\0" * 8)
    assert resolve_tokenizer({"config": {"tokenizer": str(tmp_path / "x.bin")}},
                             tmp_path).kind is None


async def test_proxy_command_with_a_gguf_tokenizer(tmp_path: Path) -> None:
    path = build_gguf_file(tmp_path / "q.gguf", "qwen25")
    b = PromptBuilder(ChatTokenizer(path))
    policy = Policy(b, "qwen25", turns=1)
    runner, base = await start_fake(Script(ids=[], policy=policy))
    env = {**os.environ, "TRACEWIRE_SESSION_TOKEN": "t0k", "HF_HUB_OFFLINE": "1",
           "TRACEWIRE_CACHE": str(tmp_path / "cache")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tracewire", "proxy", "--upstream", base + "/v1",
        "--tokenizer", str(path), "--model", "m", stdout=asyncio.subprocess.PIPE, env=env)
    try:
        assert proc.stdout is not None
        url = (await asyncio.wait_for(proc.stdout.readline(), 120)).decode().strip()
        async with aiohttp.ClientSession(headers={"Authorization": "Bearer t0k"}) as c, \
                c.post(url + "/sessions", json={}) as r:
            assert r.status == 201
            d = await r.json()
        client = openai.AsyncOpenAI(base_url=d["base_url"], api_key=d["api_key"],
                                    max_retries=0)
        out = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=32)
        await client.close()
        assert out.choices[0].message.content == "step 0"
        assert policy.log[0][0] == b.render_full([{"role": "user", "content": "hi"}]).ids
        # A fixture vocabulary builds in milliseconds: nothing is left in the cache.
        assert not list((tmp_path / "cache" / "tokenizers").glob("gguf-*.json"))
    finally:
        proc.terminate()
        await proc.wait()
        await runner.cleanup()
