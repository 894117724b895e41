"""``tracewire proxy --upstream URL --tokenizer DIR``: a real subprocess serves chat
requests token-in/token-out against the fake vLLM ``/v1/completions``."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import aiohttp
import openai

from tracewire.tito import ChatTokenizer, PromptBuilder

from .e2e_harness import Policy
from .fake_servers import Script, start_fake
from .helpers import TOOLS


async def test_proxy_command_with_a_tokenizer(tok_dirs: dict[str, Path],
                                              toks: dict[str, ChatTokenizer]) -> None:
    b = PromptBuilder(toks["qwen25"])
    policy = Policy(b, "qwen25", turns=1)
    runner, base = await start_fake(Script(ids=[], policy=policy))
    env = {**os.environ, "TRACEWIRE_SESSION_TOKEN": "t0k", "HF_HUB_OFFLINE": "1"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tracewire", "proxy", "--upstream", base + "/v1",
        "--tokenizer", str(tok_dirs["qwen25"]), "--upstream-api", "completions",
        "--model", "m", stdout=asyncio.subprocess.PIPE, env=env)
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
            model="m", messages=[{"role": "user", "content": "hi"}], tools=TOOLS,  # type: ignore[list-item]
            max_tokens=32)
        await client.close()
        assert out.choices[0].message.content == "step 0"  # the fake's final answer
        # The prompt went to the token-in endpoint as ids this process can reproduce.
        assert policy.log[0][0] == b.render_full([{"role": "user", "content": "hi"}],
                                                 TOOLS).ids
    finally:
        proc.terminate()
        await proc.wait()
        await runner.cleanup()
