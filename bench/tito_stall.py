"""What a hostile or huge token-in/token-out turn costs the proxy's other sessions.

    .venv/bin/python bench/tito_stall.py [--runs 3]

Three processes, as deployed: a fake vLLM ``/v1/completions`` (prebuilt replies; a mock by
necessity, no vLLM here), a ``Proxy`` over a ``TokenUpstream`` (the qwen25 fixture
tokenizer, as ``--tokenizer`` builds it), and this load generator. Session B sends short
turns back to back; each is timed while session A does one of:

- ``idle``: nothing (the machine's own noise: what B's turns cost with no A at all);
- ``reply_200k_ids``: a turn that asks for 200,000 tokens and gets them (decoded,
  checked, parsed and recorded by the proxy);
- ``ids_out_of_range``: a reply whose ids hold -1, 2**31 and an id beyond the vocabulary
  (refused with a 502 and recorded as a failed call);
- ``summary_20k``: ``GET /sessions/A`` on a ~20k-id branch of one-token-per-character
  answers (the mismatch report aligns thousands of retokenized stretches).

Metric ``other_session_max_ms`` (and ``_p50_ms``): the slowest (median) B turn while A's
event ran, medians over ``--runs``; the goal is 50 ms, and ``idle`` is the floor to read
it against. A's own answer is read as bytes and never parsed here, so this process's work
does not slow B's measurement.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

sys.path.insert(0, str(Path(__file__).parent))
from _common import serve_app

TOKEN = "tws-bench"
BIG = 200_000
ANSWER = "The answer to {t} plus {t} is {s}; Paris is sunny at 21 degrees, Berlin rains. "


def _completion(ids: list[int], prompt: list[int]) -> bytes:
    return orjson.dumps({
        "id": "cmpl-1", "object": "text_completion", "model": "m",
        "choices": [{"index": 0, "text": "", "token_ids": ids, "prompt_token_ids": prompt,
                     "finish_reason": "stop",
                     "logprobs": {"tokens": [f"token_id:{i}" for i in ids],
                                  "token_logprobs": [-0.5] * len(ids)}}],
        "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids)}})


def _upstream_main(tok_dir: str, q: Any) -> None:
    from tracewire.tito import ChatTokenizer, PromptBuilder

    b = PromptBuilder(ChatTokenizer(tok_dir))
    stop = b.family.stop_ids[0]
    vocab = b.tok.vocab_size
    ok = [*b.tok.encode("ok"), stop]
    # Prebuilt: the fake's own JSON work must not be what the proxy waits for.
    big = [i % 256 for i in range(BIG - 1)] + [stop]
    bad = [5, -1, 2**31, vocab + 7, stop]

    async def handle(req: web.Request) -> web.Response:
        body = orjson.loads(await req.read())
        prompt = body["prompt"]
        tail = b.tok.decode(prompt[-40:])
        if "flood" in tail:
            out = _completion(big, prompt)
        elif "badids" in tail:
            out = _completion(bad, prompt)
        elif "essay" in tail:
            t = b.tok.decode(prompt).count("essay")
            text = ANSWER.format(t=t, s=2 * t) * 14
            out = _completion([*(i for ch in text for i in b.tok.encode(ch)), stop], prompt)
        else:
            out = _completion(ok, prompt)
        return web.Response(body=out, content_type="application/json")

    async def main() -> None:
        app = web.Application(client_max_size=1 << 28)
        app.router.add_post("/v1/completions", handle)
        q.put(await serve_app(app) + "/v1")
        await asyncio.Event().wait()

    asyncio.run(main())


def _proxy_main(upstream: str, tok_dir: str, q: Any) -> None:
    import gc

    from tracewire.compose import make_upstream
    from tracewire.proxy import Proxy, ProxyConfig

    gc.freeze()  # as `tracewire proxy` does after its imports

    async def main() -> None:
        cfg = ProxyConfig(session_token=TOKEN)
        up = make_upstream(upstream, cfg, model="m", tokenizer=tok_dir)
        async with Proxy(up, config=cfg) as p:
            q.put((p.url, [(s.id, s.base_url, s.secret)
                           for s in (p.create_session() for _ in range(8))]))
            await asyncio.Event().wait()

    asyncio.run(main())


async def _turn(http: aiohttp.ClientSession, base: str, secret: str,
                msgs: list[dict[str, str]], max_tokens: int = 64) -> tuple[int, bytes]:
    async with http.post(base + "/chat/completions", data=orjson.dumps(
            {"model": "m", "messages": msgs, "max_tokens": max_tokens}),
            headers={"Authorization": f"Bearer {secret}",
                     "Content-Type": "application/json"}) as r:
        return r.status, await r.read()


async def _while(http: aiohttp.ClientSession, other: tuple[str, str, str], event: Any,
                 min_s: float = 0.0) -> list[float]:
    """B's turn latencies (ms) while ``event`` runs (and at least ``min_s``)."""
    _, base, secret = other
    msgs = [{"role": "user", "content": "hi"}]
    task = asyncio.ensure_future(event)
    lat: list[float] = []
    t_end = time.perf_counter() + min_s
    while not task.done() or not lat or time.perf_counter() < t_end:
        t0 = time.perf_counter()
        status, body = await _turn(http, base, secret, msgs)
        assert status == 200, body[:200]
        lat.append((time.perf_counter() - t0) * 1000)
    await task
    return lat


async def _measure(url: str, sessions: list[tuple[str, str, str]], run: int
                   ) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http:
        other = sessions[0]
        for _ in range(20):  # warm the proxy's paths and B's bridge
            await _turn(http, other[1], other[2], [{"role": "user", "content": "hi"}])
        out["idle"] = await _while(http, other, asyncio.sleep(1.0))

        a = sessions[1 + 3 * run]
        out["reply_200k_ids"] = await _while(http, other, _expect(
            _turn(http, a[1], a[2], [{"role": "user", "content": "flood"}], BIG + 8), 200))
        a = sessions[2 + 3 * run]
        out["ids_out_of_range"] = await _while(http, other, _expect(
            _turn(http, a[1], a[2], [{"role": "user", "content": "badids"}]), 502))

        sid, base, secret = sessions[3 + 3 * run]
        msgs: list[dict[str, str]] = [{"role": "system", "content": "Be long."}]
        for t in range(20):
            msgs.append({"role": "user", "content": f"essay {t}, please"})
            status, body = await _turn(http, base, secret, msgs, 4096)
            assert status == 200, body[:200]
            msgs.append({"role": "assistant",
                         "content": orjson.loads(body)["choices"][0]["message"]["content"]})

        async def summary() -> None:
            async with http.get(f"{url}/sessions/{sid}",
                                headers={"Authorization": f"Bearer {TOKEN}"}) as r:
                assert r.status == 200, await r.text()
                await r.read()

        out["summary_20k"] = await _while(http, other, summary())
    return out


async def _expect(coro: Any, status: int) -> None:
    got, body = await coro
    assert got == status, (got, body[:300])


def _line(case: str, metric: str, value: float, runs: int) -> None:
    print(json.dumps({"bench": "tito_stall", "case": case, "metric": metric, "unit": "ms",
                      "ours": round(value, 2), "baseline": None, "ratio": None,
                      "better": "lower", "runs": runs}), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=2)
    args = ap.parse_args()
    from tracewire.tito.fixtures import build_tokenizer_dir

    ctx = mp.get_context("spawn")
    q: Any = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        tok_dir = str(build_tokenizer_dir(Path(tmp) / "qwen25", "qwen25"))
        up = ctx.Process(target=_upstream_main, args=(tok_dir, q), daemon=True)
        up.start()
        upstream = q.get(True, 120)
        px = ctx.Process(target=_proxy_main, args=(upstream, tok_dir, q), daemon=True)
        px.start()
        try:
            url, sessions = q.get(True, 120)
            results: dict[str, list[dict[str, float]]] = {}
            for run in range(min(args.runs, 2)):  # 8 sessions: B + 3 per run
                for case, lat in asyncio.run(_measure(url, sessions, run)).items():
                    results.setdefault(case, []).append(
                        {"max": max(lat), "p50": statistics.median(lat), "n": len(lat)})
        finally:
            px.terminate()
            up.terminate()
    for case, rs in results.items():
        _line(case, "other_session_max_ms", statistics.median(r["max"] for r in rs), len(rs))
        _line(case, "other_session_p50_ms", statistics.median(r["p50"] for r in rs), len(rs))
        print(f"# {case}: B turns per run {[int(r['n']) for r in rs]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
