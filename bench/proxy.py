"""Proxy overhead: added latency per turn vs. calling the same upstream directly.

Processes: the proxy, and this process, which runs both the load generator and a fast fake
vLLM-shaped upstream on one event loop. The apparatus shares one process so the proxy has a
core to itself on the 2-core VM: with three busy processes on two cores, one of them waits
a scheduler time slice (5-12 ms lags measured in the proxy's loop, no GC) and p99 measured
the scheduler, not the proxy. ``--separate-upstream`` restores the three-process layout.
Cases:
``overhead_64_sessions`` (64 sessions, 500 turns/s in total, p50/p99 of proxy latency minus
the direct latency at the same load) and ``one_session`` (the proxy's own cost of turn 10
vs. turn 1,000 of one long session: proxied minus direct latency of the same request).
Run: ``.venv/bin/python bench/proxy.py [SECONDS] [--separate-upstream]``.
"""

from __future__ import annotations

import asyncio
import gc
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from typing import Any

import aiohttp
import orjson
from aiohttp import web

ROLES = {"system": 10, "user": 11, "assistant": 12, "tool": 13}


def _ids(text: str) -> list[int]:
    return [1000 + b for b in text.encode()]


def _render(messages: list[dict[str, Any]]) -> list[int]:
    out: list[int] = []
    for m in messages:
        out += [ROLES[m["role"]], *_ids(m.get("content") or ""), 2]
    return [*out, 12]


async def _fake_chat(request: web.Request) -> web.Response:
    req = orjson.loads(await request.read())
    msgs = req["messages"]
    content = f"ok {len(msgs)}"
    comp = [*_ids(content), 2]
    body: dict[str, Any] = {
        "id": "chatcmpl-b", "object": "chat.completion", "created": 0, "model": "fake",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                     "finish_reason": "stop",
                     "logprobs": {"content": [{"token": "x", "logprob": -0.5, "bytes": [],
                                               "top_logprobs": []} for _ in comp]}
                     if req.get("logprobs") else None,
                     "token_ids": comp if req.get("return_token_ids") else None}],
        "usage": {"prompt_tokens": 1, "completion_tokens": len(comp), "total_tokens": 1},
        "prompt_token_ids": _render(msgs) if req.get("return_token_ids") else None,
    }
    return web.Response(body=orjson.dumps(body), content_type="application/json")


async def _start_upstream() -> tuple[web.AppRunner, str]:
    app = web.Application(client_max_size=1 << 30)
    app.router.add_post("/v1/chat/completions", _fake_chat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}/v1"


def _upstream_main(q: Any) -> None:
    gc.freeze()  # as tracewire's own processes do after start-up (cli.main)

    async def main() -> None:
        _, url = await _start_upstream()
        q.put(url)
        await asyncio.Event().wait()

    asyncio.run(main())


def _proxy_main(upstream: str, n: int, q: Any) -> None:
    from tracewire.proxy import Proxy

    gc.freeze()  # this process stands for `tracewire proxy`, which freezes after imports

    async def main() -> None:
        async with Proxy(upstream, session_api=False) as p:
            q.put([(s.base_url, s.secret) for s in (p.create_session() for _ in range(n))])
            await asyncio.Event().wait()

    asyncio.run(main())


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


async def _post(c: aiohttp.ClientSession, url: str, body: bytes, secret: str) -> float:
    t = time.perf_counter()
    async with c.post(url, data=body, headers={"Authorization": f"Bearer {secret}",
                                               "Content-Type": "application/json"}) as r:
        await r.read()
        assert r.status == 200, r.status
    return (time.perf_counter() - t) * 1000


async def _load(targets: list[tuple[str, str]], rate: float, seconds: float,
                token_fields: bool) -> list[float]:
    """Each target gets rate/len(targets) turns/s of a 10-turn conversation, restarted."""
    lat: list[float] = []
    per = rate / len(targets)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as c:

        async def run(i: int, url: str, secret: str) -> None:
            msgs: list[dict[str, Any]] = []
            t0 = time.perf_counter() + i / rate
            k = 0
            while True:
                due = t0 + k / per
                if due - t0 > seconds:
                    return
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
                if len(msgs) >= 20:
                    msgs = []
                msgs.append({"role": "user", "content": f"session {i} turn {k}"})
                body: dict[str, Any] = {"model": "fake", "messages": msgs}
                if token_fields:
                    body |= {"return_token_ids": True, "logprobs": True}
                lat.append(await _post(c, url + "/chat/completions", orjson.dumps(body), secret))
                msgs.append({"role": "assistant", "content": f"ok {len(msgs)}"})
                k += 1

        await asyncio.gather(*(run(i, u, s) for i, (u, s) in enumerate(targets)))
    return lat


async def _one_session(url: str, secret: str, upstream: str, turns: int) -> dict[int, float]:
    cost: dict[int, float] = {}
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "bench " * 20}]
    async with aiohttp.ClientSession() as c:
        for k in range(1, turns + 1):
            msgs.append({"role": "user", "content": f"turn {k}: " + "words " * 10})
            body = orjson.dumps({"model": "fake", "messages": msgs})
            direct_body = orjson.dumps({"model": "fake", "messages": msgs,
                                        "return_token_ids": True, "logprobs": True})
            prox = await _post(c, url + "/chat/completions", body, secret)
            d = min([await _post(c, upstream + "/chat/completions", direct_body, "x")
                     for _ in range(2)])
            cost[k] = prox - d
            msgs.append({"role": "assistant", "content": f"ok {len(msgs)}"})
    return cost


def _cpu_s(pid: int) -> float | None:
    """User+system CPU seconds of a process (Linux /proc; None elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _line(case: str, metric: str, ours: float, runs: int, baseline: float | None = None
          ) -> None:
    print(json.dumps({"bench": "proxy", "case": case, "metric": metric, "unit": "ms",
                      "ours": round(ours, 3), "baseline": baseline,
                      "ratio": None if baseline is None else round(baseline / ours, 2),
                      "better": "lower", "runs": runs}), flush=True)


async def _measure(upstream: str, sessions: list[tuple[str, str]], seconds: float,
                   proxy_pid: int) -> None:
    direct_targets = [(upstream, "x")] * 64
    await _load(direct_targets, 500, 1.0, True)  # warm up
    await _load(sessions[:64], 500, 1.0, False)
    d_lat = await _load(direct_targets, 500, seconds, True)
    c0 = _cpu_s(proxy_pid)
    p_lat = await _load(sessions[:64], 500, seconds, False)
    c1 = _cpu_s(proxy_pid)
    n = min(len(d_lat), len(p_lat))
    _line("overhead_64_sessions", "overhead_p50_ms",
          statistics.median(p_lat) - statistics.median(d_lat), n)
    _line("overhead_64_sessions", "overhead_p99_ms", _pct(p_lat, 0.99) - _pct(d_lat, 0.99), n)
    _line("overhead_64_sessions", "direct_p50_ms", statistics.median(d_lat), n)
    _line("overhead_64_sessions", "proxied_p50_ms", statistics.median(p_lat), n)
    if c0 is not None and c1 is not None:
        # CPU the proxy process spent per turn: robust to other load on the machine,
        # and 1000 / this is the turns/s one proxy process can sustain.
        _line("overhead_64_sessions", "proxy_cpu_per_turn_ms", (c1 - c0) * 1000 / len(p_lat),
              len(p_lat))
    url, secret = sessions[64]
    cost = await _one_session(url, secret, upstream, 1000)
    _line("one_session", "turn_10_ms", statistics.median(cost[k] for k in range(6, 16)), 10)
    _line("one_session", "turn_1000_ms", statistics.median(cost[k] for k in range(991, 1001)), 10)


async def _run(seconds: float, separate: bool) -> None:
    ctx = mp.get_context("spawn")
    q: Any = ctx.Queue()
    loop = asyncio.get_running_loop()
    procs = []
    runner = None
    try:
        if separate:
            up = ctx.Process(target=_upstream_main, args=(q,), daemon=True)
            up.start()
            procs.append(up)
            upstream = await loop.run_in_executor(None, q.get, True, 60)
        else:
            runner, upstream = await _start_upstream()
        px = ctx.Process(target=_proxy_main, args=(upstream, 65, q), daemon=True)
        px.start()
        procs.append(px)
        sessions = await loop.run_in_executor(None, q.get, True, 60)
        await _measure(upstream, sessions, seconds, px.pid or 0)
    finally:
        for p in procs:
            p.terminate()
        if runner is not None:
            await runner.cleanup()


def main() -> int:
    gc.freeze()  # the load generator's own full collections would blur both latencies
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    seconds = float(args[0]) if args else 8.0
    asyncio.run(_run(seconds, "--separate-upstream" in sys.argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
