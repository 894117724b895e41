"""Bad input gives OpenAI-style 4xx errors, the server keeps serving, 64 requests at once."""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import sys
from typing import Any

import aiohttp
import openai
import pytest

from tracewire.model import MAX_MODEL_LEN, MODEL_NAME, ModelServer

MSGS = [{"role": "user", "content": "What is the capital of Peru?"}]


async def _raw(s: aiohttp.ClientSession, url: str, data: bytes) -> tuple[int, Any]:
    async with s.post(url, data=data, headers={"Content-Type": "application/json"}) as r:
        return r.status, await r.json()


@pytest.mark.parametrize("path,body,status,param", [
    ("/v1/chat/completions", b"{not json", 400, None),
    ("/v1/chat/completions", b"[1, 2]", 400, None),
    ("/v1/chat/completions", b'{"model": "gpt-9", "messages": []}', 404, "model"),
    ("/v1/chat/completions", b'{"messages": "hi"}', 400, "messages"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}',
     400, "max_tokens"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": -3}',
     400, "max_tokens"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "n": "2"}',
     400, "n"),
    ("/v1/chat/completions",
     b'{"messages": [{"role": "user", "content": "x"}], "temperature": true}', 400, "temperature"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "stop": [1]}',
     400, "stop"),
    ("/v1/chat/completions", b'{"messages": [{"role": "bogus", "content": "x"}]}', 400, None),
    ("/v1/completions", b'{"prompt": [1, 999999]}', 400, "prompt"),
    ("/v1/completions", b'{"prompt": ""}', 400, "prompt"),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": 0}', 400, "max_tokens"),
    ("/tokenize", b'{"prompt": 5}', 400, "prompt"),
    ("/detokenize", b'{"tokens": ["a"]}', 400, "tokens"),
])
async def test_bad_requests_are_4xx(root_url: str, path: str, body: bytes, status: int,
                                    param: str | None) -> None:
    async with aiohttp.ClientSession() as s:
        got, err = await _raw(s, root_url + path, body)
        assert got == status
        assert set(err["error"]) == {"message", "type", "param", "code"}
        assert err["error"]["param"] == param
        ok, _ = await _raw(s, root_url + "/v1/chat/completions",
                           b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}')
        assert ok == 200


async def test_context_and_size_bounds(root_url: str) -> None:
    async with aiohttp.ClientSession() as s:
        long = {"model": MODEL_NAME, "prompt": list(range(100)) * (MAX_MODEL_LEN // 100 + 1)}
        async with s.post(root_url + "/v1/completions", json=long) as r:
            assert r.status == 400
            assert (await r.json())["error"]["code"] == "context_length_exceeded"
        too_many = {"messages": MSGS, "max_tokens": MAX_MODEL_LEN}
        async with s.post(root_url + "/v1/chat/completions", json=too_many) as r:
            assert r.status == 400
        huge = b'{"messages": [{"role": "user", "content": "' + b"a" * (9 << 20) + b'"}]}'
        async with s.post(root_url + "/v1/chat/completions", data=io.BytesIO(huge)) as r:
            assert r.status == 413
            assert "error" in await r.json()
        async with s.get(root_url + "/nope") as r:
            assert r.status == 404 and "error" in await r.json()
        async with s.get(root_url + "/health") as r:
            assert r.status == 200


async def test_64_concurrent_requests() -> None:
    async with ModelServer(seed=1) as srv:
        client = openai.AsyncOpenAI(base_url=srv.base_url, api_key="none", max_retries=0)

        async def one(i: int) -> int:
            r = await client.chat.completions.create(
                model=MODEL_NAME, messages=MSGS, seed=i, stream=i % 2 == 0,  # type: ignore[arg-type, call-overload]
                max_tokens=300)
            if i % 2 == 0:
                return len([c async for c in r])
            return len(r.choices)

        results = await asyncio.gather(*(one(i) for i in range(64)))
        assert all(n >= 1 for n in results)
        await client.close()


def test_cli_prints_base_url_and_serves() -> None:
    proc = subprocess.Popen([sys.executable, "-m", "tracewire", "model", "--port", "0",
                             "--seed", "3"], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
        client = openai.OpenAI(base_url=url, api_key="none")
        assert client.models.list().data[0].id == MODEL_NAME
    finally:
        proc.terminate()
        code = proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()
    assert code == 0


def test_help_says_demo_only() -> None:
    out = subprocess.run([sys.executable, "-m", "tracewire", "model", "--help"],
                         capture_output=True, text=True, check=True).stdout
    assert "not a useful assistant" in out
