"""Shared helpers for benches: timing medians and the JSON-line output format."""

from __future__ import annotations

import gc
import json
import statistics
import time
from collections.abc import Callable
from typing import Any


def median_ms(fn: Callable[[], Any], runs: int, *, setup: Callable[[], Any] | None = None) -> float:
    """Median wall time of ``fn()`` in milliseconds over ``runs`` calls (GC off while timed)."""
    times = []
    for _ in range(runs):
        if setup is not None:
            setup()
        gc.collect()
        gc.disable()
        try:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        finally:
            gc.enable()
    return statistics.median(times)


def emit(
    bench: str,
    case: str,
    metric: str,
    unit: str,
    ours: float,
    baseline: float | None,
    better: str,
    runs: int,
) -> None:
    """Print one figure as a JSON line; ratio > 1 always means tracewire is ahead."""
    ratio = None
    if baseline is not None and ours and baseline:
        ratio = baseline / ours if better == "lower" else ours / baseline
    print(
        json.dumps(
            {
                "bench": bench,
                "case": case,
                "metric": metric,
                "unit": unit,
                "ours": round(ours, 4),
                "baseline": None if baseline is None else round(baseline, 4),
                "ratio": None if ratio is None else round(ratio, 2),
                "better": better,
                "runs": runs,
            }
        ),
        flush=True,
    )


def serve_clock(conn: Any) -> None:
    """Answer each message on ``conn`` with this process's CPU seconds so far (a thread that
    sleeps in recv between questions; /proc's 10 ms ticks are too coarse for one turn)."""
    import threading

    def run() -> None:
        while True:
            try:
                conn.recv()
            except EOFError:
                return
            conn.send(time.process_time())

    threading.Thread(target=run, daemon=True).start()


def read_clock(conn: Any | None) -> float:
    """The CPU seconds of the process serving ``conn`` (see :func:`serve_clock`); 0 for None."""
    if conn is None:
        return 0.0
    conn.send(None)
    return float(conn.recv())


async def serve_app(app: Any) -> str:
    """Serve the aiohttp ``app`` on 127.0.0.1 (a free port); returns ``http://HOST:PORT``."""
    from aiohttp import web

    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return f"http://127.0.0.1:{runner.addresses[0][1]}"


def pass_through(target: str, route: str, token_fields: bytes = b"", lean: bool = False) -> Any:
    """The floor: a bare aiohttp pass-through that POSTs what ``route`` receives to
    ``target`` and answers with its body (same server and client stack as the proxy, nothing
    parsed, added or recorded): what any aiohttp-based proxy pays per turn.

    With ``token_fields`` (JSON object members, e.g. ``b'"return_token_ids":true'``) it is
    the *same-bytes* floor: those members are spliced in before the body's closing brace, so
    the upstream sends the answer a recording proxy must receive (vLLM's whole
    ``prompt_token_ids`` every turn), and the answer is relayed with that last top-level
    member cut off by one ``rfind``, so the harness gets about what the proxy sends it. Still
    nothing is parsed: what any proxy that asks for token ids pays per turn.

    With ``lean`` the upstream hop uses the proxy's own client (``proxy/_http_client``)
    instead of aiohttp's: the proxy exactly, less everything it parses and records."""
    import aiohttp
    from aiohttp import web
    from yarl import URL

    client: list[aiohttp.ClientSession] = []
    cut = b',"prompt_token_ids":'
    bufsize = 8 << 20 if token_fields else 1 << 16

    async def start(_app: web.Application) -> None:
        # The proxy's client settings (no cookie jar, headers set once on the session), so
        # the floor is as lean as aiohttp lets a pass-through be.
        client.append(aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), cookie_jar=aiohttp.DummyCookieJar(),
            headers={"Content-Type": "application/json"}))

    lean_client: list[Any] = []

    async def start_lean(_app: web.Application) -> None:
        from tracewire.proxy._http_client import HttpClient

        lean_client.append(HttpClient(target, headers={"Content-Type": "application/json"}))

    def with_fields(body: bytes) -> bytes:
        return body[:body.rindex(b"}")] + b"," + token_fields + b"}" if token_fields else body

    def without_ids(answer: bytes) -> bytes:
        at = answer.rfind(cut) if token_fields else -1
        return answer[:at] + b"}" if at > 0 else answer

    path = URL(target).raw_path

    async def forward_lean(request: web.Request) -> web.Response:
        a = await lean_client[0].request("POST", path, with_fields(await request.read()))
        return web.Response(body=without_ids(a.body), status=a.status,
                            content_type="application/json")

    async def forward(request: web.Request) -> web.Response:
        body = with_fields(await request.read())
        # The same-bytes floor reads as the proxy does: a read buffer that holds the whole
        # answer, so its 400 KB of ids never pause the socket (aiohttp's default is 64 KB).
        async with client[0].post(target, data=body, read_bufsize=bufsize) as r:
            answer = without_ids(await r.read())
            return web.Response(body=answer, status=r.status, content_type="application/json")

    app = web.Application(client_max_size=1 << 30)
    app.on_startup.append(start_lean if lean else start)
    app.router.add_post(route, forward_lean if lean else forward)
    return app
