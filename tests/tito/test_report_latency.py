"""A long branch's session summary does not hold up other sessions.

Session A is a 20-turn conversation whose every answer is ~1,000 ids sampled one token per
character (a non-canonical tokenization, so the mismatch report has ~20k ids of real
differences to align). While ``GET /sessions/A`` computes its report, session B keeps
sending turns; each of B's turns is timed. The property (asked for by the issue, hence a
latency bound in a test; the figures live in bench/tito_report.py): B is answered within a
generous bound while A's report runs. Before the report went linear and off the planner's
lock, a 20k-id branch held every other session for seconds.

A real Proxy and TokenUpstream; the model is the loopback fake vLLM (a mock by necessity).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp

from tracewire.compose import make_upstream
from tracewire.proxy import Proxy
from tracewire.tito import ChatTokenizer, PromptBuilder, TokenUpstream

from .fake_servers import Script, start_fake

ANSWER = "The answer to {t} plus {t} is {s}; Paris is sunny at 21 degrees, Berlin rains. "
#: Generous: 5x the 50 ms the issue asks for, on a shared 2-core machine under test load.
BOUND_S = 0.25


async def test_a_20k_token_summary_leaves_other_sessions_answered(
        tok_dirs: dict[str, Path], toks: dict[str, ChatTokenizer]) -> None:
    b = PromptBuilder(toks["qwen25"])
    stop = b.family.stop_ids[0]

    def policy(prompt: list[int]) -> tuple[list[int], str, str]:
        text = b.tok.decode(prompt[-40:])
        if "essay" in text:
            t = b.tok.decode(prompt).count("essay")
            body = ANSWER.format(t=t, s=2 * t) * 14
            ids = [i for ch in body for i in b.tok.encode(ch)]  # one token per character
            return [*ids, stop], body, "stop"
        return [*b.tok.encode("ok"), stop], "ok", "stop"

    runner, base = await start_fake(Script(ids=[], policy=policy))
    up = make_upstream(base + "/v1", tokenizer=str(tok_dirs["qwen25"]), model="m")
    assert isinstance(up, TokenUpstream)
    try:
        async with Proxy(up) as proxy, aiohttp.ClientSession() as http:
            a, bs = proxy.create_session(), proxy.create_session()

            async def turn(s_url: str, secret: str, msgs: list[dict[str, str]]) -> str:
                async with http.post(s_url + "/chat/completions", json={
                        "model": "m", "messages": msgs, "max_tokens": 2048},
                        headers={"Authorization": f"Bearer {secret}"}) as r:
                    assert r.status == 200, await r.text()
                    return str((await r.json())["choices"][0]["message"]["content"])

            msgs: list[dict[str, str]] = [{"role": "system", "content": "Be long."}]
            for t in range(20):
                msgs.append({"role": "user", "content": f"essay {t}, please"})
                msgs.append({"role": "assistant",
                             "content": await turn(a.base_url, a.secret, msgs)})
            branch = len(a.trace.branch(a.trace.leaves()[-1]))
            assert branch >= 20_000
            b_msgs = [{"role": "user", "content": "hi"}]
            await turn(bs.base_url, bs.secret, b_msgs)  # warm

            async def summary() -> dict[str, object]:
                async with http.get(f"{proxy.url}/sessions/{a.id}", headers={
                        "Authorization": f"Bearer {proxy.session_token}"}) as r:
                    assert r.status == 200
                    out: dict[str, object] = await r.json()
                    return out

            task = asyncio.create_task(summary())
            await asyncio.sleep(0)
            latencies = []
            while not task.done():
                t0 = time.perf_counter()
                await turn(bs.base_url, bs.secret, b_msgs)
                latencies.append(time.perf_counter() - t0)
            report = await task
    finally:
        await runner.cleanup()
    # The report did real work: thousands of retokenized stretches, none a bug.
    tito = report["tito"]
    assert isinstance(tito, dict) and report["tito_mismatch"] == 0
    assert tito["recorded_tokens"] >= 20_000 and tito["by_kind"].get("retokenized", 0) > 100
    assert latencies, "B sent no turn while A's summary ran"
    assert max(latencies) < BOUND_S, (max(latencies), len(latencies))
