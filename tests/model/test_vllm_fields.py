"""vLLM token fields over raw HTTP (aiohttp client): ids, /tokenize, logprob rescoring."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import model_data as md
import pytest

from tracewire.model import MODEL_NAME


async def _post(session: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, Any]:
    async with session.post(url, json=body) as r:
        return r.status, await r.json()


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.8, 0.9), (0.0, 1.0)])
async def test_ids_tokenize_detokenize_and_rescoring(root_url: str, temperature: float,
                                                     top_p: float) -> None:
    msgs = [{"role": "system", "content": md.TOOLS_SYSTEM},
            {"role": "user", "content": "Convert 40 kg to lb."}]
    async with aiohttp.ClientSession() as s:
        for seed in range(5):
            body = {"model": MODEL_NAME, "messages": msgs, "tools": md.TOOLS, "seed": seed,
                    "temperature": temperature, "top_p": top_p, "logprobs": True,
                    "top_logprobs": 3, "return_token_ids": True}
            status, r = await _post(s, f"{root_url}/v1/chat/completions", body)
            assert status == 200
            prompt, choice = r["prompt_token_ids"], r["choices"][0]
            ids = choice["token_ids"]
            _, tk = await _post(s, f"{root_url}/tokenize", {"model": MODEL_NAME, "messages": msgs,
                                                             "tools": md.TOOLS})
            assert tk["tokens"] == prompt and tk["count"] == len(prompt)
            assert tk["max_model_len"] >= len(prompt)
            entries = choice["logprobs"]["content"]
            assert len(entries) == len(ids)
            for e in entries:
                assert -9999.0 < e["logprob"] <= 0.0
                assert len(e["top_logprobs"]) == 3
            # the text (and raw tool-call text) is what the ids spell
            _, dt = await _post(s, f"{root_url}/detokenize", {"model": MODEL_NAME, "tokens": ids})
            msg = choice["message"]
            expect = (msg["content"] or "") + "".join(
                f"<|call|>{c['function']['name']}<|args|>{c['function']['arguments']}<|endcall|>"
                for c in msg.get("tool_calls") or [])
            assert dt["prompt"] == expect + "<|eot|>"
            # rescoring through /v1/completions with the same ids and settings reproduces them
            status, cr = await _post(s, f"{root_url}/v1/completions", {
                "model": MODEL_NAME, "prompt": prompt + ids, "echo": True, "logprobs": 0,
                "max_tokens": 0, "temperature": temperature, "top_p": top_p,
                "tracewire": {"tool_choice": r["tracewire"]["tool_choice"]}})
            assert status == 200
            scored = cr["choices"][0]["logprobs"]["token_logprobs"][len(prompt):]
            assert scored == [e["logprob"] for e in entries]


async def test_tokens_as_token_ids_and_completions_text(root_url: str) -> None:
    async with aiohttp.ClientSession() as s:
        _, r = await _post(s, f"{root_url}/v1/chat/completions", {
            "model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "seed": 1,
            "logprobs": True, "return_tokens_as_token_ids": True, "return_token_ids": True})
        c = r["choices"][0]
        assert [e["token"] for e in c["logprobs"]["content"]] == [
            f"token_id:{t}" for t in c["token_ids"]]
        _, cr = await _post(s, f"{root_url}/v1/completions", {
            "model": MODEL_NAME, "prompt": "<|user|>What is the plural of fox?<|eot|><|assistant|>",
            "max_tokens": 20, "seed": 3, "return_token_ids": True, "logprobs": 2})
        ch = cr["choices"][0]
        _, dt = await _post(s, f"{root_url}/detokenize", {"tokens": ch["token_ids"]})
        assert dt["prompt"].removesuffix("<|eot|>") == ch["text"]
        assert len(ch["logprobs"]["top_logprobs"][0]) == 2
        prompt = "<|user|>What is the plural of fox?<|eot|><|assistant|>"
        _, tk = await _post(s, f"{root_url}/tokenize", {"prompt": prompt})
        assert ch["prompt_token_ids"] == tk["tokens"]


async def test_completions_streaming_matches(root_url: str) -> None:
    body = {"model": MODEL_NAME, "prompt": "<|user|>Convert 3 km to mi.<|eot|><|assistant|>",
            "max_tokens": 30, "seed": 9, "return_token_ids": True, "temperature": 1.5}
    async with aiohttp.ClientSession() as s:
        _, full = await _post(s, f"{root_url}/v1/completions", body)
        text, ids = "", []
        async with s.post(f"{root_url}/v1/completions", json={**body, "stream": True}) as r:
            async for line in r.content:
                if line.startswith(b"data: {"):
                    c = json.loads(line[6:])["choices"][0]
                    text += c["text"]
                    ids += c.get("token_ids", [])
    assert text == full["choices"][0]["text"]
    assert ids == full["choices"][0]["token_ids"]
