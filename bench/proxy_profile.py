"""Where the proxy's CPU per turn goes: drives one target of bench/proxy.py (the proxy, or a
floor) under one steady load and reports its CPU per turn, optionally sampled by py-spy.

Not a bench (it prints no JSON lines and has no baseline): a tool for the next cut. The
processes are bench/proxy.py's own (fake upstream, proxy, floors); the load is its 64-session
one (``--load sessions``, every turn a new user message), turns 1-24 of fresh
conversations, one at a time (``--load turn10``), or one conversation from turn 1,000 on
(``--load turn1000``; the 1,000 turns before are run first, unsampled).

Run: ``.venv/bin/python bench/proxy_profile.py [SECONDS]
[--target proxy|floor|floor_ids|floor_lean_ids] [--load sessions|turn10|turn1000]
[--py-spy PATH_TO_PY_SPY] [--out FILE]``. With ``--py-spy`` the
target is sampled at 2 kHz for the whole load and ``FILE`` (default
``/tmp/proxy_profile.txt``) gets py-spy's raw (collapsed) stacks; the summary printed is
the share of samples each function is on the stack of (inclusive) and at the top of
(self), heaviest first.
"""

from __future__ import annotations

import asyncio
import collections
import multiprocessing as mp
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).parent))
from _common import read_clock
from proxy import _floor_main, _load, _pin, _proxy_main, _upstream_main


def _arg(name: str, default: str) -> str:
    if name in sys.argv:
        return sys.argv[sys.argv.index(name) + 1]
    return default


class _Conversation:
    """One harness conversation through a target, a request at a time."""

    def __init__(self, c: aiohttp.ClientSession, target: tuple[str, str], tag: str) -> None:
        self.c, self.url, self.tag = c, target[0] + "/chat/completions", tag
        self.headers = {"Authorization": f"Bearer {target[1]}",
                        "Content-Type": "application/json"}
        self.msgs: list[dict[str, Any]] = [{"role": "system", "content": "bench " * 20}]

    async def turn(self) -> None:
        k = len(self.msgs) // 2 + 1
        self.msgs.append({"role": "user", "content": f"{self.tag} turn {k}: " + "words " * 10})
        body = orjson.dumps({"model": "fake", "messages": self.msgs})
        async with self.c.post(self.url, data=body, headers=self.headers) as r:
            await r.read()
            assert r.status == 200, r.status
        self.msgs.append({"role": "assistant", "content": f"ok {len(self.msgs)}"})


async def _one_session(c: aiohttp.ClientSession, target: tuple[str, str], seconds: float,
                       long: _Conversation | None) -> int:
    """One request at a time for ``seconds``: turns of ``long`` when given, else turns 1-24
    of fresh conversations."""
    n, conv = 0, 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        if long is not None:
            await long.turn()
            n += 1
            continue
        conv += 1
        fresh = _Conversation(c, target, f"c{conv}")
        for _ in range(24):
            await fresh.turn()
            n += 1
    return n


def _summary(path: str, top: int = 40) -> None:
    incl: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    total = 0
    for line in Path(path).read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        k = int(count)
        total += k
        frames = stack.split(";")
        for f in dict.fromkeys(frames):
            incl[f] += k
        own[frames[-1]] += k
    print(f"{total} samples")
    print("inclusive:")
    for f, k in incl.most_common(top):
        print(f"  {100 * k / total:5.1f}%  {f}")
    print("self:")
    for f, k in own.most_common(top):
        print(f"  {100 * k / total:5.1f}%  {f}")


async def _run(seconds: float, target: str, load: str, spy: str | None, out: str) -> None:
    ctx = mp.get_context("spawn")
    q: Any = ctx.Queue()
    loop = asyncio.get_running_loop()
    procs = []
    try:
        up = ctx.Process(target=_upstream_main, args=(q,), daemon=True)
        up.start()
        procs.append(up)
        upstream = await loop.run_in_executor(None, q.get, True, 60)
        clock, child = ctx.Pipe()
        if target == "proxy":
            px = ctx.Process(target=_proxy_main, args=(upstream, 64, q, child), daemon=True)
        else:
            px = ctx.Process(target=_floor_main, daemon=True, args=(
                upstream, q, child, target != "floor", target == "floor_lean_ids"))
        px.start()
        procs.append(px)
        got = await loop.run_in_executor(None, q.get, True, 60)
        targets = got if target == "proxy" else [(got, "x")] * 64
        _pin([px.pid or 0], [up.pid or 0])
        # The harness never asks for token ids: the proxy and the same-bytes floors add them.
        await _load(targets, 500, 1.0, False)  # warm up
        c = aiohttp.ClientSession()
        long = None
        if load == "turn1000":
            long = _Conversation(c, targets[0], "long")
            for _ in range(1000):
                await long.turn()
        sampler = None
        if spy:
            sampler = await asyncio.create_subprocess_exec(
                spy, "record", "-p", str(px.pid), "-r", "2000", "-f", "raw", "-o", out,
                "-d", str(int(seconds) + 1), "--nonblocking", stdout=asyncio.subprocess.DEVNULL)
            await asyncio.sleep(0.5)
        c0 = read_clock(clock)
        if load == "sessions":
            n = len(await _load(targets, 500, seconds, False))
        else:
            n = await _one_session(c, targets[0], seconds, long)
        await c.close()
        cpu = read_clock(clock) - c0
        print(f"{target} {load}: {n} turns, {cpu * 1000 / n:.3f} ms CPU per turn")
        if sampler is not None:
            await sampler.wait()
            _summary(out)
    finally:
        for p in procs:
            p.terminate()


def main() -> int:
    args = [a for i, a in enumerate(sys.argv[1:], 1)
            if not a.startswith("--") and not sys.argv[i - 1].startswith("--")]
    seconds = float(args[0]) if args else 10.0
    asyncio.run(_run(seconds, _arg("--target", "proxy"), _arg("--load", "sessions"),
                     _arg("--py-spy", "") or None, _arg("--out", "/tmp/proxy_profile.txt")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
