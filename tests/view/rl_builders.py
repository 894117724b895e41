"""Runs for the RL views' tests: a real train run, two real eval runs, and hand-built pairs of
rollouts that part at a known message and token."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import numpy as np

from tracewire.compose import evaluate
from tracewire.store import open_run
from tracewire.trace import Episode, Message
from tracewire.train import TrainConfig, group_advantages, train

from .builders import write_run

TRAIN_STEPS = 3


def in_thread(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run ``coro`` on a loop of its own (Playwright's sync API keeps one on the test thread)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def make_train_run(out: Path) -> Path:
    """A real ``tracewire train`` run: 3 steps of 2 tasks x 3 rollouts, built-in model."""
    cfg = TrainConfig(steps=TRAIN_STEPS, group_size=3, tasks_per_step=2, lr=5.0, concurrency=4)
    in_thread(train("arithmetic", cfg, out=out))
    return out


def make_eval_runs(a: Path, b: Path) -> tuple[Path, Path]:
    """Two real eval runs of the same 4 tasks x 4 rollouts with different sampling seeds."""
    async def both() -> None:
        await evaluate("arithmetic", n=4, r=4, out=a, seed=1, concurrency=4)
        await evaluate("arithmetic", n=4, r=4, out=b, seed=2, concurrency=4)

    in_thread(both())
    return a, b


def expected_groups(path: Path) -> dict[str, dict[str, Any]]:
    """Per group id, from the store's index: rewards by episode and the trainer's advantages."""
    rows = open_run(path).rows()
    keys = [r.group_id or "task:" + r.task_key for r in rows]
    adv = group_advantages([r.reward for r in rows], keys)
    out: dict[str, dict[str, Any]] = {}
    for r, k, a in zip(rows, keys, adv, strict=True):
        g = out.setdefault(k, {"reward": {}, "advantage": {}, "parts": {}, "task": r.task_key})
        g["reward"][r.episode_id] = r.reward
        g["advantage"][r.episode_id] = float(a)
        g["parts"][r.episode_id] = dict(r.rewards)
    return out


def expected_compare(a: Path, b: Path) -> dict[str, float]:
    """Per task: B's mean reward minus A's, from the two indexes."""
    def means(p: Path) -> dict[str, float]:
        got: dict[str, list[float]] = {}
        for r in open_run(p).rows():
            got.setdefault(r.task_key, []).append(r.reward)
        return {k: sum(v) / len(v) for k, v in got.items()}

    ma, mb = means(a), means(b)
    return {k: mb[k] - ma[k] for k in ma if k in mb}


PROMPT_IDS = [10, 11, 12, 13, 14, 15]


def rollout(answers: list[list[int]], *, task: str = "pair", group: str | None = "pair-group",
            index: int = 0, reward: float = 0.0, texts: list[str] | None = None) -> Episode:
    """A rollout of ``len(answers)`` turns: a fixed system+user prompt, then per turn a sampled
    answer with the given ids (logprob of token k: ``-0.01 * (k + 1)``) and a fixed tool
    result. ``texts`` names the answers (defaults: their ids)."""
    ep = Episode(env="pairs", task_key=task, group_id=group, group_index=index, run="fixture")
    tr = ep.new_trace()
    s = tr.add_node(Message(role="system", content="Be brief."), ids=[1, 2, 3])
    parent = tr.add_node(Message(role="user", content="Count."), parent=s, ids=PROMPT_IDS)
    for t, ids in enumerate(answers):
        text = texts[t] if texts else " ".join(map(str, ids))
        lp = -0.01 * (np.arange(len(ids), dtype=np.float32) + 1)
        a = tr.add_node(Message(role="assistant", content=text), parent=parent, sampled=True,
                        ids=ids, logprobs=lp)
        parent = tr.add_node(Message(role="tool", content=f"ok {t}", tool_call_id=f"c{t}"),
                             parent=a, ids=[20 + t, 21 + t])
    tr.set_reward("correct", reward)
    tr.stop = "done"
    tr.completed = True
    return ep


def diff_pair(turns: int, at_turn: int, at_token: int, n_out: int = 12
              ) -> tuple[Episode, Episode]:
    """Two rollouts equal up to token ``at_token`` of their answer in turn ``at_turn``."""
    base = [[100 + 13 * t + k for k in range(n_out)] for t in range(turns)]
    other = [list(x) for x in base]
    other[at_turn][at_token] += 1
    texts_a = [f"answer {t}" for t in range(turns)]
    texts_b = list(texts_a)
    texts_b[at_turn] = f"answer {at_turn} (other)"
    a = rollout(base, index=0, reward=1.0, texts=texts_a)
    b = rollout(other, index=1, reward=0.0, texts=texts_b)
    return a, b


async def write_pairs(path: Path, pairs: list[Episode]) -> None:
    """A run holding the given rollouts."""
    await write_run(path, pairs, meta={"name": "pairs"})
