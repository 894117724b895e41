"""Token-in/token-out over a real engine: llama.cpp's ``llama-server`` on SmolLM2-135M.

Processes: llama-server (one thread, ``--metrics``), the proxy (``--tokenizer`` the GGUF,
``--upstream-api llamacpp``), a floor hop (a bare aiohttp pass-through of ``/completion``
bytes that parses and records nothing), and this load generator (the harness). Each turn of
one conversation (64-token completions: the end-of-turn id is biased away so every turn is
exactly 64 tokens) is asked three ways in a row: through the proxy (chat completions; the
proxy renders, bridges and records), directly (the same ``/completion`` body the proxy sent,
rebuilt from the prompt ids it reports), and through the floor hop (that body again).

The engine's own time per call (prompt + generation seconds, from ``/metrics`` deltas) is
subtracted from each call's wall time, so the different prompt-cache states of the three
calls cancel; what is left is HTTP, JSON and, for the proxy, its work. Cases:
``per_turn_64``: ``added_ms`` (proxy minus direct, median over turns; baseline: the floor
hop's), ``added_pct_of_engine`` (of the direct call's wall time), ``proxy_cpu_per_turn_ms``
(baseline: the floor process's CPU per call), ``added_ms_over_floor``; ``tokens_per_s``:
generation tokens/s of proxied vs direct calls (engine seconds; the proxy's CPU competes
with the engine on 2 cores). ``render``: the proxy's render/bridge time for turn 10 vs turn
100 of one 100-turn conversation over a fast loopback ``/completion`` fake (medians of
turns 8-12 and 96-100).

Run: ``.venv/bin/python bench/engine.py [--turns 12] [--render-turns 100]``; binary and
model from ``$TRACEWIRE_LLAMA_SERVER`` / ``$TRACEWIRE_GGUF`` or the per-machine cache.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import multiprocessing as mp
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

sys.path.insert(0, str(Path(__file__).parent))
from _common import emit, pass_through, read_clock, serve_app, serve_clock

MAX_TOKENS = 64
SAMPLING = {"temperature": 0.8, "top_p": 0.95, "top_k": 40, "logit_bias": {"2": -100}}


def _cache() -> Path:
    if os.environ.get("TRACEWIRE_CACHE"):
        return Path(os.environ["TRACEWIRE_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tracewire"


def _paths() -> tuple[Path, Path]:
    binary = os.environ.get("TRACEWIRE_LLAMA_SERVER")
    gguf = os.environ.get("TRACEWIRE_GGUF")
    b = Path(binary) if binary else max((_cache() / "llama.cpp").glob("*/llama-server"))
    g = Path(gguf) if gguf else _cache() / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return b, g


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_engine(binary: Path, gguf: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = _port()
    proc = subprocess.Popen([str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port",
                             str(port), "-t", "1", "-tb", "1", "-c", "8192", "-np", "1",
                             "--metrics", "--no-webui"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    import urllib.request
    for _ in range(600):
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("llama-server did not become healthy")


def _proxy_main(engine: str, gguf: str, q: Any, clock: Any) -> None:
    from tracewire.compose import make_upstream
    from tracewire.proxy import Proxy

    async def main() -> None:
        up = make_upstream(engine, tokenizer=gguf, upstream_api="llamacpp", model="smollm2")
        gc.freeze()
        serve_clock(clock)
        async with Proxy(up, session_api=False) as p:
            s = p.create_session()
            q.put((s.base_url, s.secret))
            await asyncio.Event().wait()

    asyncio.run(main())


def _floor_main(engine: str, q: Any, clock: Any) -> None:
    gc.freeze()
    serve_clock(clock)

    async def main() -> None:
        q.put(await serve_app(pass_through(engine + "/completion", "/completion")))
        await asyncio.Event().wait()

    asyncio.run(main())


async def _metrics(http: aiohttp.ClientSession, engine: str) -> dict[str, float]:
    async with http.get(engine + "/metrics") as r:
        text = await r.text()
    out = {}
    for line in text.splitlines():
        if line.startswith("llamacpp:"):
            k, _, v = line.partition(" ")
            out[k[9:]] = float(v)
    return out


async def _timed(http: aiohttp.ClientSession, engine: str, url: str, body: bytes,
                 headers: dict[str, str], clock: Any | None) -> dict[str, Any]:
    """One call: wall seconds, the engine's seconds and tokens (metrics deltas), the CPU
    seconds of the process behind ``clock`` and the JSON answer."""
    m0 = await _metrics(http, engine)
    c0 = read_clock(clock)
    t0 = time.perf_counter()
    async with http.post(url, data=body, headers=headers) as r:
        raw = await r.read()
        assert r.status == 200, raw[:300]
    wall = time.perf_counter() - t0
    c1 = read_clock(clock)
    for _ in range(50):  # the server books a request's seconds when its slot is released
        m1 = await _metrics(http, engine)
        if m1["tokens_predicted_total"] > m0["tokens_predicted_total"]:
            break
        await asyncio.sleep(0.002)
    d = {k: m1[k] - m0[k] for k in ("prompt_seconds_total", "tokens_predicted_seconds_total",
                                    "tokens_predicted_total")}
    engine_s = d["prompt_seconds_total"] + d["tokens_predicted_seconds_total"]
    return {"wall": wall, "engine": engine_s, "gen_s": d["tokens_predicted_seconds_total"],
            "gen_n": d["tokens_predicted_total"], "cpu": c1 - c0, "data": orjson.loads(raw)}


async def per_turn(engine: str, gguf: Path, turns: int) -> None:
    from tracewire.tito.codecs import SamplingParams, UpstreamApi, encode_request

    ctx = mp.get_context("spawn")
    q: Any = ctx.Queue()
    p_clock, p_child = ctx.Pipe()
    f_clock, f_child = ctx.Pipe()
    procs = [ctx.Process(target=_proxy_main, args=(engine, str(gguf), q, p_child), daemon=True),
             ctx.Process(target=_floor_main, args=(engine, q, f_child), daemon=True)]
    procs[0].start()
    base, secret = q.get(timeout=120)
    procs[1].start()
    floor = q.get(timeout=60)
    rows: list[dict[str, float]] = []
    json_h = {"Content-Type": "application/json"}
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http:
            msgs: list[dict[str, Any]] = [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "Tell me about the history of tea."}]
            for t in range(turns):
                body = {"model": "smollm2", "messages": msgs, "max_tokens": MAX_TOKENS,
                        "seed": t, "return_token_ids": True, **SAMPLING}
                p = await _timed(http, engine, base + "/chat/completions", orjson.dumps(body),
                                 {**json_h, "Authorization": f"Bearer {secret}"}, p_clock)
                prompt = p["data"]["prompt_token_ids"]
                params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.8, top_p=0.95,
                                        extra={**SAMPLING, "seed": t})
                direct_body = orjson.dumps(encode_request(UpstreamApi.LLAMACPP, prompt,
                                                          params))
                d = await _timed(http, engine, engine + "/completion", direct_body, json_h,
                                 None)
                f = await _timed(http, engine, floor + "/completion", direct_body, json_h,
                                 f_clock)
                assert len(d["data"]["tokens"]) == MAX_TOKENS == p["gen_n"]
                rows.append({"p_over": p["wall"] - p["engine"], "d_over": d["wall"] - d["engine"],
                             "f_over": f["wall"] - f["engine"], "d_wall": d["wall"],
                             "p_cpu": p["cpu"], "f_cpu": f["cpu"],
                             "p_tps": p["gen_n"] / p["gen_s"], "d_tps": d["gen_n"] / d["gen_s"]})
                msgs += [p["data"]["choices"][0]["message"],
                         {"role": "user", "content": f"Go on, part {t + 2}."}]
    finally:
        for pr in procs:
            pr.kill()
    rows = rows[2:]  # warm-up turns (first prompt evaluation, connection set-up)
    n = len(rows)

    def med(k: str) -> float:
        return statistics.median(r[k] for r in rows)

    added = statistics.median(r["p_over"] - r["d_over"] for r in rows) * 1e3
    floor_added = statistics.median(r["f_over"] - r["d_over"] for r in rows) * 1e3
    pct = statistics.median((r["p_over"] - r["d_over"]) / r["d_wall"] for r in rows) * 100
    # baseline: the floor hop (what any aiohttp pass-through in the same place costs).
    emit("engine", "per_turn_64", "added_ms", "ms", added, floor_added, "lower", n)
    emit("engine", "per_turn_64", "added_pct_of_engine", "%", pct, None, "lower", n)
    emit("engine", "per_turn_64", "proxy_cpu_per_turn_ms", "ms", med("p_cpu") * 1e3,
         med("f_cpu") * 1e3, "lower", n)
    emit("engine", "per_turn_64", "added_ms_over_floor", "ms", added - floor_added, None,
         "lower", n)
    emit("engine", "per_turn_64", "direct_wall_ms", "ms", med("d_wall") * 1e3, None, "lower", n)
    emit("engine", "tokens_per_s", "generation_tokens_per_s", "tok/s", med("p_tps"),
         med("d_tps"), "higher", n)


def render(gguf: Path, turns: int) -> None:
    """The proxy's render/bridge time per turn of one long conversation (fast fake engine)."""
    from tracewire.compose import make_upstream
    from tracewire.proxy import Proxy
    from tracewire.tito import ChatTokenizer, TokenUpstream

    tok = ChatTokenizer(gguf)
    words = "the tea was grown in the hills and carried by river to the markets of the coast"
    reply_ids = [*tok.encode(" ".join([words] * 8))[:MAX_TOKENS - 1], 2]
    times: list[float] = []

    class Timed(TokenUpstream):
        def _plan_sync(self, *a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return super()._plan_sync(*a, **kw)
            finally:
                times.append(time.perf_counter() - t0)

    async def fake(req: web.Request) -> web.Response:
        body = await req.json()
        return web.json_response({
            "content": "", "tokens": reply_ids, "stop": True, "stop_type": "eos",
            "tokens_predicted": len(reply_ids), "tokens_evaluated": len(body["prompt"]),
            "completion_probabilities": [{"id": i, "prob": 0.5} for i in reply_ids]})

    async def main() -> None:
        app = web.Application(client_max_size=1 << 28)
        app.router.add_post("/completion", fake)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        base = make_upstream(url, tokenizer=str(gguf), upstream_api="llamacpp")
        assert isinstance(base, TokenUpstream)
        up = Timed(url, base.builder, api="llamacpp")
        try:
            async with Proxy(up, session_api=False) as p, aiohttp.ClientSession() as http:
                s = p.create_session()
                msgs: list[dict[str, Any]] = [{"role": "user", "content": "Tell me of tea."}]
                for t in range(turns):
                    async with http.post(s.base_url + "/chat/completions", json={
                            "model": "m", "messages": msgs, "max_tokens": MAX_TOKENS},
                            headers={"Authorization": f"Bearer {s.secret}"}) as r:
                        d = await r.json()
                    msgs += [d["choices"][0]["message"],
                             {"role": "user", "content": f"Go on, part {t + 2}."}]
        finally:
            await runner.cleanup()

    asyncio.run(main())
    early = statistics.median(times[7:12]) * 1e3
    late = statistics.median(times[turns - 5:turns]) * 1e3
    # baseline: turn 10 of the same conversation (ratio = turn 10 / turn N; goal ≥ 0.5).
    emit("engine", "render", f"turn_{turns}_ms", "ms", late, early, "lower", 5)
    emit("engine", "render", f"turn_{turns}_over_turn_10", "x", late / early, None, "lower", 5)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=12)
    ap.add_argument("--render-turns", type=int, default=100)
    args = ap.parse_args()
    binary, gguf = _paths()
    proc, engine = _start_engine(binary, gguf)
    try:
        asyncio.run(per_turn(engine, gguf, args.turns))
    finally:
        proc.terminate()
        proc.wait(10)
    render(gguf, args.render_turns)


if __name__ == "__main__":
    main()
