"""Persisting finished episodes without stalling the event loop.

Cases: ``three_29mb_traces`` (3 episodes of 1 trace × 1,000 nodes × 2,000 tokens, ~29 MB of
JSON each, appended concurrently while a 1 ms ticker measures loop lag) and
``one_29mb_trace`` (one alone; tracemalloc peak). Baseline: the approach we replace — a
pydantic model holding Python lists, built on the loop, ``model_dump_json`` line appended
via ``asyncio.to_thread``. Ours: ``Run.append`` (fsync "never" for like-for-like durability;
the default "interval" policy's wall time is reported too).
"""

# Lambdas are awaited at once (B023); between measured runs, blocking setup is fine.
# ruff: noqa: ASYNC240

from __future__ import annotations

import asyncio
import gc
import json
import shutil
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel

from tracewire import Call, Episode, Message, Span
from tracewire.codec import encode_json
from tracewire.diagnostics import LoopLagProbe
from tracewire.store import Run

RUNS = 5


class NodeM(BaseModel):
    role: str
    content: str
    parent: int | None
    sampled: bool
    token_ids: list[int]
    mask: list[int]
    logprobs: list[float | None]


class CallM(BaseModel):
    model: str
    finish_reason: str
    usage: dict[str, int]
    node: int


class TraceM(BaseModel):
    id: str
    task_key: str
    nodes: list[NodeM]
    calls: list[CallM]
    reward: float


def make_episode(seed: int, nodes: int = 1000, tok: int = 2000) -> Episode:
    """One trace of ``nodes`` alternating prompt/sampled nodes of ``tok`` tokens each."""
    rng = np.random.default_rng(seed)
    ep = Episode(env="bench", task_key=f"t{seed}")
    t = ep.new_trace()
    for i in range(nodes):
        sampled = i % 2 == 1
        n = t.add_node(
            Message(role="assistant" if sampled else "user", content="word " * 16),
            parent=i - 1 if i else None, sampled=sampled,
            ids=rng.integers(0, 32_000, tok, dtype=np.int32),
            logprobs=np.round(rng.random(tok, dtype=np.float32) * -4, 3) if sampled else None,
        )
        if sampled:
            t.add_call(Call(model="m", endpoint="chat", finish_reason="stop", node=n,
                            prompt_node=n - 1,
                            usage={"prompt_tokens": tok, "completion_tokens": tok},
                            span=Span(start=1.0, end=2.0)))
    t.set_reward("correct", 1.0)
    return ep


def as_lists(ep: Episode) -> dict[str, Any]:
    """What the replaced systems hold: plain Python lists per node (made outside timing)."""
    t = ep.traces[0]
    cols = t.columns
    return {
        "id": ep.id, "task_key": ep.task_key, "reward": t.reward,
        "nodes": [{
            "role": nd.message.role, "content": nd.message.content, "parent": nd.parent,
            "sampled": nd.sampled, "token_ids": cols.ids[nd.start:nd.end].tolist(),
            "mask": cols.mask[nd.start:nd.end].tolist(),
            "logprobs": [None if x != x else x for x in cols.logprobs[nd.start:nd.end].tolist()],
        } for nd in t.nodes],
        "calls": [{"model": c.model, "finish_reason": c.finish_reason, "usage": c.usage,
                   "node": c.node} for c in t.calls],
    }  # fmt: skip


async def baseline_append(data: dict[str, Any], path: Path) -> None:
    model = TraceM.model_validate(data)  # built on the loop, as they do

    def write() -> None:
        line = model.model_dump_json()
        with open(path, "a") as f:
            f.write(line + "\n")

    await asyncio.to_thread(write)


async def timed(coro_fn: Any, probe_interval: float = 0.001) -> tuple[float, float]:
    async with LoopLagProbe(probe_interval) as probe:
        await asyncio.sleep(0.01)
        t0 = time.perf_counter()
        await coro_fn()
        wall = time.perf_counter() - t0
        await asyncio.sleep(0.005)
    return wall * 1e3, probe.max_ms


def line(case: str, metric: str, unit: str, ours: float, base: float | None, runs: int,
         better: str = "lower", **extra: Any) -> None:
    ratio = None
    if base is not None and ours:
        ratio = round(base / ours if better == "lower" else ours / base, 2)
    print(json.dumps({"bench": "persist", "case": case, "metric": metric, "unit": unit,
                      "ours": round(ours, 3), "baseline": None if base is None else round(base, 3),
                      "ratio": ratio, "better": better, "runs": runs, **extra}), flush=True)


async def main(runs: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="tw-persist-"))
    eps = [make_episode(s) for s in range(3)]
    lists = [as_lists(e) for e in eps]
    json_mb = len(encode_json(eps[0])) / 1e6
    base_line_mb = len(TraceM.model_validate(lists[0]).model_dump_json()) / 1e6
    res: dict[str, list[float]] = {k: [] for k in (
        "o3_wall", "o3_gap", "b3_wall", "b3_gap", "o3_wall_fsync", "o1_wall", "b1_wall")}
    try:
        for r in range(runs):
            for policy, key in (("never", "o3"), ("interval", "o3_wall_fsync")):
                run = await Run.create(tmp / f"o{r}{policy}", fsync=policy)
                wall, gap = await timed(
                    lambda run=run: asyncio.gather(*(run.append(e) for e in eps)))
                await run.close()
                if key == "o3":
                    res["o3_wall"].append(wall)
                    res["o3_gap"].append(gap)
                else:
                    res[key].append(wall)
            async def base3(r: int = r) -> None:
                await asyncio.gather(*(baseline_append(d, tmp / f"b{r}.jsonl") for d in lists))
            wall, gap = await timed(base3)
            res["b3_wall"].append(wall)
            res["b3_gap"].append(gap)
            run = await Run.create(tmp / f"one{r}", fsync="never")
            wall, _ = await timed(lambda run=run: run.append(eps[0]))
            await run.close()
            res["o1_wall"].append(wall)
            wall, _ = await timed(lambda r=r: baseline_append(lists[0], tmp / f"b1{r}.jsonl"))
            res["b1_wall"].append(wall)
            shutil.rmtree(tmp)
            tmp.mkdir()
        # Allocation: tracemalloc peak of one append (separate runs: tracing slows things).
        run = await Run.create(tmp / "alloc", fsync="never")
        rec = 0
        gc.collect()
        tracemalloc.start()
        tracemalloc.reset_peak()
        ref = await run.append(eps[1])
        ours_peak = tracemalloc.get_traced_memory()[1] / 1e6
        tracemalloc.stop()
        rec = ref.length / 1e6
        await run.close()
        gc.collect()
        tracemalloc.start()
        await baseline_append(lists[1], tmp / "alloc.jsonl")
        base_peak = tracemalloc.get_traced_memory()[1] / 1e6
        tracemalloc.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in res.items()}
    line("three_29mb_traces", "wall_ms", "ms", med["o3_wall"], med["b3_wall"], runs,
         json_mb_each=round(json_mb, 1), baseline_line_mb=round(base_line_mb, 1))
    line("three_29mb_traces", "max_loop_gap_ms", "ms", med["o3_gap"], med["b3_gap"], runs)
    line("three_29mb_traces", "wall_ms_fsync_interval", "ms", med["o3_wall_fsync"], None, runs)
    line("one_29mb_trace", "wall_ms", "ms", med["o1_wall"], med["b1_wall"], runs)
    # Our record bytes are never joined (writev of column views), so the whole traced peak
    # counts as "beyond the record"; the baseline's JSON line is subtracted from its peak.
    line("one_29mb_trace", "alloc_beyond_record_mb", "MB", ours_peak,
         max(0.0, base_peak - base_line_mb), 1, record_mb=round(rec, 1))
    line("one_29mb_trace", "peak_traced_mb", "MB", ours_peak, base_peak, 1)


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else RUNS))
