"""The proxy's upstream client against aiohttp's: CPU per call of the calling process.

Both clients POST the same chat body to bench/proxy.py's fake vLLM-shaped upstream (its own
process), one call at a time over one kept-alive connection, in alternating blocks so load
from other work lands on both alike. ``small``: the 64-session load's answer (a few hundred
bytes, no token ids asked); ``ids``: a turn-1,000-sized answer (the upstream's prompt ids of
a 2,000-message conversation, ~400 KB). The figure is the caller's CPU per call (its
process time), which is what the proxy pays per turn for its upstream hop; aiohttp runs as
the proxy ran it before (no cookie jar, headers set once on the session, a read buffer
holding the whole answer).
Run: ``.venv/bin/python bench/http_client.py [CALLS_PER_BLOCK]``.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).parent))
from _common import emit
from proxy import _upstream_main
from tracewire.proxy._http_client import HttpClient

_BLOCKS = 7


def _body(turns: int, ids: bool) -> bytes:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "bench " * 20}]
    for k in range(turns):
        msgs.append({"role": "user", "content": f"turn {k}: " + "words " * 10})
        msgs.append({"role": "assistant", "content": f"ok {len(msgs)}"})
    req: dict[str, Any] = {"model": "fake", "messages": msgs}
    if ids:
        req |= {"return_token_ids": True, "logprobs": True}
    return orjson.dumps(req)


async def _case(url: str, body: bytes, n: int) -> tuple[float, float]:
    """Medians over the blocks of (ours, aiohttp) CPU µs per call."""
    ours = HttpClient(url)
    theirs = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=1024), cookie_jar=aiohttp.DummyCookieJar(),
        timeout=aiohttp.ClientTimeout(total=600), headers={"Content-Type": "application/json"})
    target = url + "/chat/completions"
    path = "/v1/chat/completions"

    async def one_ours() -> int:
        a = await ours.request("POST", path, body)
        assert a.status == 200
        return len(a.body)

    async def one_theirs() -> int:
        async with theirs.post(target, data=body, read_bufsize=8 << 20) as r:
            data = await r.read()
            assert r.status == 200
        return len(data)

    got: dict[str, list[float]] = {"ours": [], "aiohttp": []}
    try:
        sizes = {await one_ours() for _ in range(20)} | {await one_theirs() for _ in range(20)}
        assert len(sizes) == 1, sizes  # both read the same answer
        for _ in range(_BLOCKS):
            for name, call in (("ours", one_ours), ("aiohttp", one_theirs)):
                t = time.process_time()
                for _ in range(n):
                    await call()
                got[name].append((time.process_time() - t) * 1e6 / n)
    finally:
        await ours.close()
        await theirs.close()
    return statistics.median(got["ours"]), statistics.median(got["aiohttp"])


async def _run(url: str, n: int) -> None:
    for case, body, calls in (("small", _body(5, False), n), ("ids", _body(1000, True), n // 10)):
        ours, theirs = await _case(url, body, max(10, calls))
        emit("http_client", case, "cpu_per_call_us", "us", ours, theirs, "lower",
             _BLOCKS * max(10, calls))


def main() -> int:
    # As the proxy's process runs (ProxyConfig.tune_memory): without it each 400 KB answer
    # is a fresh mmap, and the page faults, not the client, dominate the ids case.
    from tracewire._memory import tune_allocator

    tune_allocator()
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    ctx = mp.get_context("spawn")
    q: Any = ctx.Queue()
    up = ctx.Process(target=_upstream_main, args=(q,), daemon=True)
    up.start()
    try:
        asyncio.run(_run(q.get(True, 60), n))
    finally:
        up.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
