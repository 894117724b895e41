"""Bench the train loop: steps/s, sampled tokens/s and the reward curve per bundled env.

    .venv/bin/python bench/train.py [--budget 120] [--envs arithmetic,tools,guess,command]

Each env trains the built-in model for ``--budget`` seconds of wall time (or 200 steps) on
its first 8 tasks, 4 tasks × 8 rollouts per step, on-policy, lr 10. Prints one JSON line per
figure (bench "train", case = env): ``steps_per_s``, ``tokens_per_s`` (sampled tokens per
second of rollout time), ``reward_first5``/``reward_last5`` (mean reward of the first and
last 5 steps), ``reward_rise`` (their difference), ``mismatch_max`` (must be 0) and a
``curve`` line with every step's mean reward. One run per env (a run is minutes long); the
baseline is the untrained model, i.e. the first steps of the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path


def emit(case: str, metric: str, unit: str, ours: float, better: str,
         baseline: float | None = None) -> None:
    ratio = None
    if baseline:
        ratio = round(ours / baseline, 3) if better == "higher" else round(baseline / ours, 3)
    print(json.dumps({"bench": "train", "case": case, "metric": metric, "unit": unit,
                      "ours": round(ours, 4), "baseline": baseline, "ratio": ratio,
                      "better": better, "runs": 1}), flush=True)


async def one(env: str, budget: float, out: Path) -> None:
    from tracewire.train import TrainConfig, train

    cfg = TrainConfig(steps=200, group_size=8, tasks_per_step=4, n_tasks=8, lr=10.0)
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(budget, stop.set)
    t0 = time.monotonic()
    result = await train(env, cfg, out=out / env, stop=stop)
    wall = time.monotonic() - t0
    steps = result.steps
    rewards = [s.reward_mean for s in steps]
    k = min(5, max(1, len(steps) // 2))
    first, last = sum(rewards[:k]) / k, sum(rewards[-k:]) / k
    roll = sum(s.rollout_s for s in steps)
    sampled = sum(s.tokens_per_s * s.rollout_s for s in steps)
    emit(env, "steps_per_s", "1/s", len(steps) / wall, "higher")
    emit(env, "tokens_per_s", "tok/s", sampled / roll if roll else 0.0, "higher")
    emit(env, "reward_first5", "reward", first, "higher")
    emit(env, "reward_last5", "reward", last, "higher", baseline=round(first, 4))
    emit(env, "reward_rise", "reward", last - first, "higher")
    emit(env, "mismatch_max", "nats", max(s.mismatch_max for s in steps), "lower")
    print(json.dumps({"bench": "train", "case": env, "metric": "curve", "unit": "reward",
                      "steps": len(steps), "wall_s": round(wall, 1),
                      "ours": [round(r, 3) for r in rewards]}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=float, default=120.0, help="seconds per env")
    ap.add_argument("--envs", default="arithmetic,tools,guess,command")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for env in args.envs.split(","):
            asyncio.run(one(env, args.budget, Path(tmp)))


if __name__ == "__main__":
    main()
