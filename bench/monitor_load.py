"""Sustained load: 1,000 episodes totalling >= 4 GB of token data appended as they arrive,
while the loop lag probe (1 ms) runs and RSS is sampled (psutil). The run dir is deleted.

Episodes share their (read-only) column arrays, so generating them costs nothing; every
episode is still encoded, CRC-checked, written and indexed on its own. They are built
before the probe starts: building one (80 nodes, 40 calls) on the loop as a slot frees up is
the bench's own work, not the store's, and it alone raised p99 from ~0.8 to ~1.3 ms
(``--build-on-arrival`` shows it).

Like tracewire's own processes (cli.main), the bench freezes its start-up objects
(``gc.freeze()``, recommended in docs/ARCHITECTURE.md) so that a full garbage collection does
not scan them: on the development VM one full pass over ~30,000 start-up objects stalls the
loop by 20-30 ms whatever the store does (``--no-freeze`` shows it).

Case ``kernel_floor``: in the same run, another process writes the same number of bytes in
the same way (512 KiB writes, fdatasync every 100 ms) while this process's loop does nothing
but run the probe: the lag that the machine's write path causes without any of our code.

    python bench/monitor_load.py [--no-freeze] [--no-floor] [--build-on-arrival]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil

from tracewire import Call, Columns, Episode, Message, Node, Span, Trace
from tracewire.diagnostics import LoopLagProbe
from tracewire.store import Run

EPISODES = 1000
TOKENS = 450_000  # x 9 bytes (ids, mask, logprobs) = 4.05 MB per episode
TURNS = 40


def template() -> tuple[dict[str, np.ndarray], list[tuple[int, int]]]:
    rng = np.random.default_rng(0)
    arrays = {
        "ids": rng.integers(0, 32_000, TOKENS, dtype=np.int32),
        "mask": (np.arange(TOKENS) % 2).astype(np.uint8),
        "logprobs": rng.random(TOKENS, dtype=np.float32) * -3,
    }
    step = TOKENS // (2 * TURNS)
    return arrays, [(k * step, (k + 1) * step) for k in range(2 * TURNS)]


def make(i: int, arrays: dict[str, np.ndarray], slices: list[tuple[int, int]]) -> Episode:
    t = Trace(columns=Columns.from_arrays(arrays))
    for k, (a, b) in enumerate(slices):
        t.nodes.append(Node(parent=k - 1 if k else None, message=Message(
            role="assistant" if k % 2 else "user", content=f"m{k}"), sampled=bool(k % 2),
            start=a, end=b))
        if k % 2:
            t.calls.append(Call(model="m", finish_reason="stop", node=k, prompt_node=k - 1,
                                usage={"prompt_tokens": b - a, "completion_tokens": b - a},
                                span=Span(start=1.0, end=2.0)))
    t.set_reward("r", float(i % 2))
    return Episode(env="bench", task_key=f"t{i}", traces=[t])


FLOOR_WRITER = """
import os, sys, time
total, path = int(sys.argv[1]), sys.argv[2]
buf = os.urandom(512 * 1024)
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
print("ready", flush=True)
sys.stdin.readline()
done, synced = 0, time.monotonic()
while done < total:
    done += os.write(fd, buf)
    if time.monotonic() - synced >= 0.1:
        os.fdatasync(fd)
        synced = time.monotonic()
os.fdatasync(fd)
os.close(fd)
"""


def floor_writer(nbytes: int, tmp: Path) -> subprocess.Popen[str]:
    """Start (and wait for) the process that writes ``nbytes`` to ``tmp`` when told to."""
    proc = subprocess.Popen([sys.executable, "-c", FLOOR_WRITER, str(nbytes), str(tmp / "f")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


async def kernel_floor(proc: subprocess.Popen[str]) -> LoopLagProbe:
    """Probe this (otherwise idle) loop while ``proc`` writes."""
    assert proc.stdin is not None
    async with LoopLagProbe(0.001) as probe:
        proc.stdin.write("go\n")
        proc.stdin.flush()
        while proc.poll() is None:
            await asyncio.sleep(0.05)
    assert proc.returncode == 0, proc.returncode
    return probe


async def main(floor: bool, prebuild: bool = True) -> None:
    arrays, slices = template()
    tmp = Path(tempfile.mkdtemp(prefix="tw-load-"))
    proc = psutil.Process()
    rss: list[tuple[int, float]] = []
    done = [0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.05):
            rss.append((done[0], proc.memory_info().rss / 1e6))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    written = 0
    try:
        run = await Run.create(tmp / "load", fsync="interval")
        inflight = asyncio.Semaphore(16)

        ready = [make(i, arrays, slices) for i in range(EPISODES)] if prebuild else []

        async def one(i: int) -> None:
            nonlocal written
            try:
                ref = await run.append(ready[i] if prebuild else make(i, arrays, slices))
                written += ref.length
                done[0] += 1
            finally:
                inflight.release()

        async def arrive() -> None:
            # Episodes arrive one by one as room frees up (at most 16 in flight). Creating
            # all 1,000 tasks up front would make one ~50 ms loop iteration of the bench's
            # own making, which the probe would then blame on the store.
            tasks = []
            for i in range(EPISODES):
                await inflight.acquire()
                tasks.append(asyncio.create_task(one(i)))
            await asyncio.gather(*tasks)

        async with LoopLagProbe(0.001) as probe:
            t0 = time.perf_counter()
            await arrive()
            wall = time.perf_counter() - t0
        await run.close()
        floor_probe = await kernel_floor(floor_writer(written, tmp)) if floor else None
    finally:
        stop.set()
        sampler.join()
        shutil.rmtree(tmp, ignore_errors=True)
    warm = [m for n, m in rss if n >= EPISODES // 10]
    growth = (max(warm) - warm[0]) if warm else 0.0

    def emit(metric: str, unit: str, ours: float, better: str = "lower",
             case: str = "1000_episodes") -> None:
        print(json.dumps({"bench": "monitor_load", "case": case, "metric": metric,
                          "unit": unit, "ours": round(ours, 3), "baseline": None, "ratio": None,
                          "better": better, "runs": 1}), flush=True)

    emit("lag_p99_ms", "ms", probe.p99_ms)
    emit("lag_max_ms", "ms", probe.max_ms)
    emit("rss_growth_mb", "MB", growth)
    emit("gb_written", "GB", written / 1e9, "higher")
    emit("gb_per_s", "GB/s", written / 1e9 / wall, "higher")
    if floor_probe is not None:
        emit("lag_p99_ms", "ms", floor_probe.p99_ms, case="kernel_floor")
        emit("lag_max_ms", "ms", floor_probe.max_ms, case="kernel_floor")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-freeze", action="store_true", help="leave start-up objects to the GC")
    ap.add_argument("--no-floor", action="store_true", help="skip the kernel_floor case")
    ap.add_argument("--build-on-arrival", action="store_true",
                    help="build each episode on the loop when its slot frees (old behaviour)")
    a = ap.parse_args()
    if not a.no_freeze:
        gc.freeze()
    asyncio.run(main(not a.no_floor, not a.build_on_arrival))
    sys.exit(0)
