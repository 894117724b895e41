"""Worst event-loop stall while persisting episodes of 10 … 10,000 turns × 1,000 tokens.

A 5 ms ticker (``LoopLagProbe``) runs while one episode is persisted. Ours: ``Run.append``
(encoding, CRC and I/O in the writer thread). Baseline: a pydantic model of Python lists
built on the loop, ``model_dump_json`` line written via ``asyncio.to_thread``.
``encode_cpu_ms`` is the CPU time of encoding alone (ours: record parts; baseline: build +
``model_dump_json``).
"""

# Lambdas are awaited at once (B023); between measured runs, blocking setup is fine.
# ruff: noqa: B023, ASYNC240

from __future__ import annotations

import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from tracewire import Call, Episode, Message, Span
from tracewire.codec import encode_record
from tracewire.diagnostics import LoopLagProbe
from tracewire.store import Run

sys.path.insert(0, str(Path(__file__).parent))
from persist import TraceM, as_lists, baseline_append

SIZES = (10, 100, 1000, 3000, 10000)


def make(turns: int, tok: int = 1000, seed: int = 0) -> Episode:
    """``turns`` turns: a prompt node of tok/2 tokens and a sampled node of tok/2 tokens."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 32_000, turns * tok, dtype=np.int32)
    lps = np.round(rng.random(turns * tok // 2, dtype=np.float32) * -4, 3)
    ep = Episode(env="bench", task_key=f"t{turns}")
    t = ep.new_trace()
    h = tok // 2
    for k in range(turns):
        p = t.add_node(Message(role="user", content=f"tool output {k}"),
                       parent=len(t.nodes) - 1 if t.nodes else None,
                       ids=ids[k * tok : k * tok + h])
        c = t.add_node(Message(role="assistant", content=f"thinking about step {k}"), parent=p,
                       sampled=True, ids=ids[k * tok + h : (k + 1) * tok],
                       logprobs=lps[k * h : (k + 1) * h])
        t.add_call(Call(model="m", endpoint="chat", finish_reason="stop", node=c, prompt_node=p,
                        usage={"prompt_tokens": h, "completion_tokens": h},
                        span=Span(start=1.0, end=2.0)))
    return ep


async def worst(fn: Any) -> float:
    async with LoopLagProbe(0.005) as probe:
        await asyncio.sleep(0.02)
        await fn()
        await asyncio.sleep(0.01)
    return probe.max_ms


def cpu_ms(fn: Any) -> float:
    t0 = time.process_time()
    fn()
    return (time.process_time() - t0) * 1e3


def emit(case: str, metric: str, ours: float, base: float, runs: int) -> None:
    print(json.dumps({"bench": "stall", "case": case, "metric": metric, "unit": "ms",
                      "ours": round(ours, 3), "baseline": round(base, 3),
                      "ratio": round(base / ours, 2) if ours else None, "better": "lower",
                      "runs": runs}), flush=True)


async def main(runs: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="tw-stall-"))
    try:
        for turns in SIZES:
            ep = make(turns)
            lists = as_lists(ep)
            n = runs if turns < 3000 else max(3, runs // 2)
            o_stall, b_stall, o_cpu, b_cpu = [], [], [], []
            for r in range(n):
                run = await Run.create(tmp / f"o{turns}-{r}", fsync="interval")
                o_stall.append(await worst(lambda run=run: run.append(ep)))
                await run.close()
                b_stall.append(await worst(
                    lambda r=r: baseline_append(lists, tmp / f"b{turns}-{r}.jsonl")))
                o_cpu.append(cpu_ms(lambda: encode_record(ep, pause=lambda: None)))
                b_cpu.append(cpu_ms(lambda: TraceM.model_validate(lists).model_dump_json()))
                shutil.rmtree(tmp)
                tmp.mkdir()
            case = f"turns_{turns}"
            emit(case, "worst_stall_ms", statistics.median(o_stall),
                 statistics.median(b_stall), n)
            emit(case, "encode_cpu_ms", statistics.median(o_cpu), statistics.median(b_cpu), n)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 5))
