"""Proxy overhead: added latency per turn vs. calling the same upstream directly.

Processes, as deployed: the load generator (the harnesses), a fast fake vLLM-shaped
upstream, and the proxy. Direct turns go harness -> upstream, proxied ones harness -> proxy
-> upstream, each hop between processes as in production. ``--shared-upstream`` runs the
upstream on the load generator's event loop instead (two busy processes on the 2-core VM
rather than three, but the direct baseline then never crosses a process, so the proxy is
also charged for the wake-ups a real direct call pays too). The proxy is pinned to a core of
its own and the apparatus to the others (see ``_pin``); ``--no-pin`` leaves placement to
the scheduler.
Cases:
``overhead_64_sessions`` (64 sessions, 500 turns/s in total, p50/p99 of proxy latency minus
the direct latency at the same load) and ``one_session`` (the proxy's own cost of turn 10
vs. turn 1,000 of one long session: proxied minus direct latency of the same request,
medians of turns 5-24, of that session and of four fresh ones, and of turns 981-1000;
every 64-session turn carries a new user message, as in real use). ``floor_*``: the same
for a bare aiohttp pass-through that parses and records nothing (``_floor_main``),
measured in the same run: the part of the overhead that is aiohttp's HTTP server and
client plus one more hop, not ours. The proxy and the floor are measured interleaved
(64-session loads in alternating slices, one-session turns in alternating blocks of ten),
so load from other work on a shared machine lands on both alike and the ratios hold where
single figures swing.
``floor_ids_*``: the *same-bytes* floor, also bare (nothing parsed), which asks the upstream
for the proxy's token fields and relays the answer with its ``prompt_token_ids`` cut off:
what any proxy that records token ids must receive (the whole prompt's ids every turn, as
vLLM answers) without anything a recording adds. ``vs_floor_*`` and ``vs_floor_ids_*``
are the proxy's ratios to each.
``--lean-floor`` adds ``floor_lean_ids_*``: the same-bytes floor with the proxy's own
upstream client instead of aiohttp's (``pass_through(lean=True)``), i.e. the proxy less
everything it parses and records: what the recording itself costs.
Run: ``.venv/bin/python bench/proxy.py [SECONDS] [--shared-upstream] [--no-pin] [--lean-floor]``.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

sys.path.insert(0, str(Path(__file__).parent))
from _common import pass_through, read_clock, serve_app, serve_clock

ROLES = {"system": 10, "user": 11, "assistant": 12, "tool": 13}
# JSON text of each message's rendered ids, memoized: a real server's prompt work is on its
# GPU, and a fake that re-rendered thousands of messages in Python per turn would bury the
# proxy's cost in the upstream's noise.
_RENDERED: dict[tuple[str, str], bytes] = {}


def _ids(text: str) -> list[int]:
    return [1000 + b for b in text.encode()]


def _rendered(role: str, content: str) -> bytes:
    key = (role, content)
    out = _RENDERED.get(key)
    if out is None:
        out = _RENDERED[key] = b",".join(
            str(i).encode() for i in (ROLES[role], *_ids(content), 2))
    return out


def _prompt_json(messages: list[dict[str, Any]]) -> bytes:
    """The JSON array of the prompt's ids (messages rendered, then the assistant header)."""
    parts = [_rendered(m["role"], m.get("content") or "") for m in messages]
    return b"[" + b",".join([*parts, b"12"]) + b"]"


async def _fake_chat(request: web.Request) -> web.Response:
    req = orjson.loads(await request.read())
    msgs = req["messages"]
    content = f"ok {len(msgs)}"
    comp = [*_ids(content), 2]
    want_ids = bool(req.get("return_token_ids"))
    body: dict[str, Any] = {
        "id": "chatcmpl-b", "object": "chat.completion", "created": 0, "model": "fake",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                     "finish_reason": "stop",
                     "logprobs": {"content": [{"token": "x", "logprob": -0.5, "bytes": [],
                                               "top_logprobs": []} for _ in comp]}
                     if req.get("logprobs") else None,
                     "token_ids": comp if want_ids else None}],
        "usage": {"prompt_tokens": 1, "completion_tokens": len(comp), "total_tokens": 1},
    }
    out = orjson.dumps(body)
    # vLLM's field order: prompt_token_ids is the last top-level key.
    tail = b',"prompt_token_ids":' + (_prompt_json(msgs) if want_ids else b"null") + b"}"
    return web.Response(body=out[:-1] + tail, content_type="application/json")


async def _start_upstream() -> tuple[web.AppRunner, str]:
    app = web.Application(client_max_size=1 << 30)
    app.router.add_post("/v1/chat/completions", _fake_chat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}/v1"


def _upstream_main(q: Any) -> None:
    _tune()
    _no_gc()

    async def main() -> None:
        _, url = await _start_upstream()
        q.put(url)
        await asyncio.Event().wait()

    asyncio.run(main())


def _proxy_main(upstream: str, n: int, q: Any, clock: Any) -> None:
    from tracewire.proxy import Proxy

    gc.freeze()  # this process stands for `tracewire proxy`, which freezes after imports
    serve_clock(clock)

    async def main() -> None:
        async with Proxy(upstream, session_api=False) as p:
            q.put([(s.base_url, s.secret) for s in (p.create_session() for _ in range(n))])
            await asyncio.Event().wait()

    asyncio.run(main())


def _floor_main(upstream: str, q: Any, clock: Any, same_bytes: bool = False,
                lean: bool = False) -> None:
    """The floor: a bare aiohttp pass-through (same server and client stack as the proxy,
    nothing parsed, added or recorded). What any aiohttp-based proxy pays per turn. With
    ``same_bytes`` it asks for the proxy's token fields and relays the answer without its
    prompt ids (``pass_through``): what any proxy that records token ids pays."""
    _tune()  # as the proxy does (ProxyConfig.tune_memory), so the floor is a floor
    gc.freeze()
    serve_clock(clock)
    fields = orjson.dumps(_TOKEN_FIELDS)[1:-1] if same_bytes else b""

    async def main() -> None:
        url = await serve_app(pass_through(upstream + "/chat/completions",
                                           "/v1/chat/completions", fields, lean))
        q.put(url + "/v1")
        await asyncio.Event().wait()

    asyncio.run(main())


#: What the proxy adds to every upstream request (ProxyConfig's default token fields).
_TOKEN_FIELDS = {"return_token_ids": True, "logprobs": True}


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
    """Each target gets rate/len(targets) turns/s of a 10-turn conversation, restarted.
    Every turn's user message is new (the load's number is in it): a target that records
    must then add it, as in real use, rather than match a conversation it has seen."""
    lat: list[float] = []
    tag = next(_LOADS)
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
                msgs.append({"role": "user", "content": f"load {tag} session {i} turn {k}"})
                body: dict[str, Any] = {"model": "fake", "messages": msgs}
                if token_fields:
                    body |= _TOKEN_FIELDS
                lat.append(await _post(c, url + "/chat/completions", orjson.dumps(body), secret))
                msgs.append({"role": "assistant", "content": f"ok {len(msgs)}"})
                k += 1

        await asyncio.gather(*(run(i, u, s) for i, (u, s) in enumerate(targets)))
    return lat


async def _one_session(targets: list[tuple[str, str, Any, bool]], upstream: str, turns: int
                       ) -> list[tuple[dict[int, float], dict[int, float]]]:
    """Per turn of one long conversation through each target ``(url, secret, clock,
    token_fields)``: its latency minus the best of two direct calls made right after
    (asking for token ids as the proxy does, or not), and the CPU ms the target's process
    spent from this turn's request to the next one's (so the turn's commit, which runs
    after its answer, is counted). The targets take turns in blocks of ``_BLOCK`` turns
    (the same conversation each), so load from other work on the machine lands on all of
    them alike, while each still runs most of its turns with its own caches warm."""
    out: list[tuple[dict[int, float], dict[int, float]]] = [({}, {}) for _ in targets]
    last = [read_clock(t[2]) for t in targets]
    convs: list[list[dict[str, Any]]] = [
        [{"role": "system", "content": "bench " * 20}] for _ in targets]
    up = upstream + "/chat/completions"
    async with aiohttp.ClientSession() as c:
        for first in range(1, turns + 1, _BLOCK):
            for i, (url, secret, clock, token_fields) in enumerate(targets):
                cost, cpu = out[i]
                msgs = convs[i]
                for k in range(first, min(turns, first + _BLOCK - 1) + 1):
                    msgs.append({"role": "user", "content": f"turn {k}: " + "words " * 10})
                    body = orjson.dumps({"model": "fake", "messages": msgs})
                    direct_body = orjson.dumps({"model": "fake", "messages": msgs,
                                                **_TOKEN_FIELDS}) if token_fields else body
                    prox = await _post(c, url + "/chat/completions", body, secret)
                    cost[k] = prox - min([await _post(c, up, direct_body, "x")
                                          for _ in range(2)])
                    now = read_clock(clock)
                    cpu[k], last[i] = (now - last[i]) * 1000, now
                    msgs.append({"role": "assistant", "content": f"ok {len(msgs)}"})
    return out


def _line(case: str, metric: str, ours: float, runs: int, baseline: float | None = None,
          unit: str = "ms") -> None:
    print(json.dumps({"bench": "proxy", "case": case, "metric": metric, "unit": unit,
                      "ours": round(ours, 3), "baseline": baseline,
                      "ratio": None if baseline is None else round(baseline / ours, 2),
                      "better": "lower", "runs": runs}), flush=True)


async def _measure(upstream: str, floors: list[tuple[str, str, Any]],
                   sessions: list[tuple[str, str]], seconds: float, pclock: Any) -> None:
    """``floors``: (case prefix, URL, CPU clock) of each floor, measured beside the proxy."""
    direct_targets = [(upstream, "x")] * 64
    await _load(direct_targets, 500, 1.0, True)  # warm up
    await _load(sessions[:64], 500, 1.0, False)
    for _, floor, _ in floors:
        await _load([(floor, "x")] * 64, 500, 1.0, False)
    d_lat: list[float] = []
    p_lat: list[float] = []
    f_lat: dict[str, list[float]] = {name: [] for name, _, _ in floors}
    f_sec = dict.fromkeys(f_lat, 0.0)
    fd_lat: list[float] = []
    p_sec = 0.0
    # Slices of each load in turn, so that load from other work on the machine lands on the
    # proxy and the floors alike.
    for _ in range(_SLICES):
        part = seconds / _SLICES
        d_lat += await _load(direct_targets, 500, part, True)
        c0 = read_clock(pclock)
        p_lat += await _load(sessions[:64], 500, part, False)
        p_sec += read_clock(pclock) - c0
        for name, floor, fclock in floors:
            f0 = read_clock(fclock)
            f_lat[name] += await _load([(floor, "x")] * 64, 500, part, False)
            f_sec[name] += read_clock(fclock) - f0
        fd_lat += await _load(direct_targets, 500, part, False)
    n = min(len(d_lat), len(p_lat))
    _line("overhead_64_sessions", "overhead_p50_ms",
          statistics.median(p_lat) - statistics.median(d_lat), n)
    _line("overhead_64_sessions", "overhead_p99_ms", _pct(p_lat, 0.99) - _pct(d_lat, 0.99), n)
    _line("overhead_64_sessions", "direct_p50_ms", statistics.median(d_lat), n)
    _line("overhead_64_sessions", "proxied_p50_ms", statistics.median(p_lat), n)
    _line("overhead_64_sessions", "direct_p99_ms", _pct(d_lat, 0.99), n)
    _line("overhead_64_sessions", "proxied_p99_ms", _pct(p_lat, 0.99), n)
    # CPU the proxy process spent per turn: robust to other load on the machine, and
    # 1000 / this is the turns/s one proxy process can sustain. The floors', same load.
    p_cpu = p_sec * 1000 / len(p_lat)
    _line("overhead_64_sessions", "proxy_cpu_per_turn_ms", p_cpu, len(p_lat))
    for name, _, _ in floors:
        lat = f_lat[name]
        f_cpu = f_sec[name] * 1000 / len(lat)
        _line(f"{name}_64_sessions", "cpu_per_turn_ms", f_cpu, len(lat))
        _line(f"vs_{name}_64_sessions", "cpu_per_turn_x", p_cpu / f_cpu, len(p_lat), unit="x")
        # The same-bytes floor's direct twin would ask for token ids: its p50 is compared
        # with the proxy's direct figure, the plain floor's with a direct call without them.
        direct = d_lat if name != "floor" else fd_lat
        n = min(len(lat), len(direct))
        _line(f"{name}_64_sessions", "overhead_p50_ms",
              statistics.median(lat) - statistics.median(direct), n)
        _line(f"{name}_64_sessions", "overhead_p99_ms",
              _pct(lat, 0.99) - _pct(direct, 0.99), n)
    def one(url: str, secret: str) -> list[tuple[str, str, Any, bool]]:
        # The plain floor relays what the harness asked for, so its direct twin asks for
        # no token ids; the same-bytes floor's asks for them, as the proxy's does.
        return [(url, secret, pclock, True),
                *((floor, "x", fclock, name != "floor") for name, floor, fclock in floors)]

    # Turn 10 from several fresh conversations (one turn's CPU swings with whatever else
    # the machine does in that millisecond), turn 1,000 from the one long conversation.
    early = [await _one_session(one(*sessions[65 + r]), upstream, _EARLY.stop - 1)
             for r in range(_EARLY_ROUNDS)]
    runs = await _one_session(one(*sessions[64]), upstream, 1000)
    med: dict[tuple[str, str], float] = {}
    cases = ["one_session", *(f"{name}_one_session" for name, _, _ in floors)]
    for i, (case, (c, u)) in enumerate(zip(cases, runs, strict=True)):
        for name, window in (("turn_10", _EARLY), ("turn_1000", _LATE)):
            conv = [(c, u)] + ([e[i] for e in early] if window is _EARLY else [])
            lat = [cc[k] for cc, _ in conv for k in window]
            cpu = [uu[k] for _, uu in conv for k in window]
            med[case, name] = statistics.median(lat)
            _line(case, f"{name}_ms", med[case, name], len(lat))
            med[case, name + "_cpu"] = statistics.median(cpu)
            _line(case, f"{name}_cpu_ms", med[case, name + "_cpu"], len(cpu))
    for fname, _, _ in floors:
        fc, vs = f"{fname}_one_session", f"vs_{fname}_one_session"
        for name in ("turn_10", "turn_1000"):
            _line(vs, f"{name}_cpu_x",
                  med["one_session", name + "_cpu"] / med[fc, name + "_cpu"],
                  len(_EARLY) * (1 + _EARLY_ROUNDS) if name == "turn_10" else len(_LATE),
                  unit="x")
        # How the proxy's cost grows from turn 10 to turn 1,000, relative to the floor's.
        _line(vs, "growth_x",
              (med["one_session", "turn_1000"] / med["one_session", "turn_10"])
              / (med[fc, "turn_1000"] / med[fc, "turn_10"]), len(_LATE), unit="x")
        _line(vs, "cpu_growth_x",
              (med["one_session", "turn_1000_cpu"] / med["one_session", "turn_10_cpu"])
              / (med[fc, "turn_1000_cpu"] / med[fc, "turn_10_cpu"]), len(_LATE), unit="x")


#: Numbers each ``_load`` call, so no two calls send the same conversation.
_LOADS = itertools.count()
#: Turns a one-session target runs before the next target takes its turn.
_BLOCK = 10
#: How many alternating slices the 64-session loads are measured in.
_SLICES = 4
#: The turns whose median cost stands for "turn 10" and "turn 1,000" (20 each: one turn's
#: difference of two latencies swings by a millisecond on the 2-core VM).
_EARLY = range(5, 25)
_LATE = range(981, 1001)
#: Fresh conversations run to turn 24 for the turn-10 figure, besides the long one.
_EARLY_ROUNDS = 4


async def _run(seconds: float, shared: bool, pin: bool, lean: bool = False) -> None:
    ctx = mp.get_context("spawn")
    q: Any = ctx.Queue()
    loop = asyncio.get_running_loop()
    procs = []
    runner = None
    try:
        if not shared:
            up = ctx.Process(target=_upstream_main, args=(q,), daemon=True)
            up.start()
            procs.append(up)
            upstream = await loop.run_in_executor(None, q.get, True, 60)
        else:
            runner, upstream = await _start_upstream()
        pclock, pclock_child = ctx.Pipe()
        floors: list[tuple[str, str, Any]] = []
        kinds = [("floor", False, False), ("floor_ids", True, False)]
        if lean:
            kinds.append(("floor_lean_ids", True, True))
        for name, same_bytes, lean_hop in kinds:
            fclock, fclock_child = ctx.Pipe()
            fl = ctx.Process(target=_floor_main,
                             args=(upstream, q, fclock_child, same_bytes, lean_hop), daemon=True)
            fl.start()
            procs.append(fl)
            floors.append((name, await loop.run_in_executor(None, q.get, True, 60), fclock))
        px = ctx.Process(target=_proxy_main, args=(upstream, 65 + _EARLY_ROUNDS, q, pclock_child),
                         daemon=True)
        px.start()
        procs.append(px)
        measured = procs[-1 - len(floors):]
        if pin:
            # The floors take the proxy's core too: they are measured in its place.
            _pin([p.pid or 0 for p in measured],
                 [p.pid or 0 for p in procs if p not in measured])
        sessions = await loop.run_in_executor(None, q.get, True, 60)
        await _measure(upstream, floors, sessions, seconds, pclock)
    finally:
        for p in procs:
            p.terminate()
        if runner is not None:
            await runner.cleanup()


def _pin(measured: list[int], apparatus: list[int]) -> None:
    """Give the proxy (and the floor) a core of their own, the harnesses and upstream the
    others (Linux), as on a many-core node where nothing starves the proxy.

    Pinned, the figures do not depend on where the scheduler happens to put the proxy
    (bench/README.md, proxy, has what pinning changed).
    """
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cpus) < 2:
        return
    rest = set(cpus[:-1])
    for pid in measured:
        os.sched_setaffinity(pid, {cpus[-1]})
    for pid in [0, *apparatus]:
        os.sched_setaffinity(pid, rest)


def _tune() -> None:
    # The apparatus keeps freed bodies in its heap as the proxy does (ProxyConfig.tune_memory):
    # page faults on the 400 KB answers of turn 1,000 made the fake upstream slow and noisy,
    # and a direct call that receives that answer cheaply hides none of the proxy's cost.
    from tracewire._memory import tune_allocator

    tune_allocator()


def _no_gc() -> None:
    # Apparatus only: the fake upstream parses 2,000 messages per turn late in one_session,
    # and collections triggered by those dicts landed at random in either the proxied or
    # the direct call of a pair, blurring the difference measured. They make no cycles
    # worth collecting in a bench run. (The proxy's process keeps its GC, frozen.)
    gc.freeze()
    gc.disable()


def main() -> int:
    _tune()
    _no_gc()
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    seconds = float(args[0]) if args else 8.0
    asyncio.run(_run(seconds, "--shared-upstream" in sys.argv, "--no-pin" not in sys.argv,
                     "--lean-floor" in sys.argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
