"""``train``: an RL loop on the built-in model that consumes samples the way a trainer does.

Each step runs ``group_size`` rollouts of ``tasks_per_step`` tasks through a proxy whose
upstream is the model server's URL for one policy version (so every turn of an episode is
sampled by the weights its ``policy_version`` names), turns each trace into the session
API's safetensors payload and decodes it back, rescoring every sampled token under the
sampler's weights (the mismatch, which must be 0) and under the current ones (the ratio),
and applies a clipped, importance-weighted policy-gradient step. With ``max_staleness K``
the next ``K`` batches are already rolling out on older weights while a step trains; the new
weights are swapped into the running server, whose requests in flight keep theirs.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from .._errors import EnvError
from ..store import RunStatus
from ..trace import InfoKey
from ._objective import group_advantages, pg_coefficients
from ._wiring import (
    MODEL_NAME,
    ChatTemplate,
    Environment,
    Episode,
    ModelServer,
    Policy,
    Proxy,
    Run,
    RunWriter,
    Sample,
    Task,
    assemble,
    close_http_client,
    decode_samples,
    encode_samples,
    get_engine,
    load_environment,
    rescore,
    run_rollout,
)

__all__ = ["StepSummary", "TrainConfig", "TrainResult", "train"]


@dataclass
class TrainConfig:
    """How to train (defaults suit a laptop: a step takes a second or two)."""

    steps: int = 20
    group_size: int = 8
    tasks_per_step: int = 4
    lr: float = 10.0
    max_staleness: int = 0
    clip: float = 0.2
    temperature: float = 1.0
    top_p: float = 1.0
    concurrency: int = 16
    seed: int = 0
    n_tasks: int | None = None  # train on the first N tasks only (None: all)


@dataclass
class StepSummary:
    """One step's numbers (``as_dict`` for JSON)."""

    step: int
    policy_version: int  # the weights trained on (the new ones are this + 1)
    sampled_by: int  # the version that sampled this step's batch
    staleness: int
    episodes: int
    reward_mean: float
    pass_at: dict[int, float]
    samples: int
    tokens: int  # tokens trained on (loss mask)
    tokens_per_s: float  # sampled tokens per second of the batch's rollout wall time
    rollout_s: float
    update_s: float
    mismatch_max: float  # max |trainer logprob - sampler logprob| under the sampler's weights
    mismatch_kl: float  # k3 estimate of KL(sampler || trainer), same weights
    ratio_max: float  # importance ratio against the current weights
    clipped: float  # share of tokens whose clip was active
    dropped: int  # samples older than max_staleness, or without logprobs
    grad_norm: float

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict."""
        d = dict(self.__dict__)
        d["pass_at"] = {str(k): v for k, v in self.pass_at.items()}
        return d


@dataclass
class TrainResult:
    """What :func:`train` returns: the stored run's directory, each step, the final weights."""

    run_dir: Path
    steps: list[StepSummary]
    policy: Policy
    status: RunStatus = RunStatus.COMPLETE


@dataclass
class _Batch:
    index: int
    version: int
    episodes: list[Episode] = field(default_factory=list)
    samples: list[tuple[Sample, float, str]] = field(default_factory=list)
    sampled_tokens: int = 0
    wall_s: float = 0.0


def _pass_at(groups: dict[str, list[float]]) -> dict[int, float]:
    vals = [r for g in groups.values() for r in g]
    if not vals or any(r not in (0.0, 1.0) for r in vals):
        return {}
    smallest = min(len(g) for g in groups.values())
    out: dict[int, float] = {}
    k = 1
    while k <= smallest:
        per = []
        for g in groups.values():
            n, c = len(g), int(sum(g))
            per.append(1.0 if n - c < k else 1.0 - math.comb(n - c, k) / math.comb(n, k))
        out[k] = sum(per) / len(per)
        k *= 2
    return out


class _Trainer:
    def __init__(self, env: Environment, cfg: TrainConfig, run: RunWriter, server: ModelServer,
                 run_key: str) -> None:
        self.env, self.cfg, self.run, self.server, self.run_key = env, cfg, run, server, run_key
        self.engine = get_engine()
        self.template = ChatTemplate(self.engine.tok)
        self.policies: dict[int, Policy] = {0: Policy.zeros(self.engine.tok.vocab_size)}
        self.current = self.policies[0]
        server.set_policy(self.current)
        self.proxies: dict[int, Proxy] = {}
        self.tasks: list[Task] = list(env.take(cfg.n_tasks))
        if not self.tasks:
            raise EnvError(f"environment {env.name!r} has no tasks")
        self.rng = np.random.default_rng(cfg.seed)
        self.order = self.rng.permutation(len(self.tasks)).tolist()
        self.cursor = 0
        self.sem = asyncio.Semaphore(cfg.concurrency)

    def _next_tasks(self) -> list[Task]:
        out = []
        for _ in range(min(self.cfg.tasks_per_step, len(self.tasks))):
            if self.cursor >= len(self.order):
                self.order, self.cursor = self.rng.permutation(len(self.tasks)).tolist(), 0
            out.append(self.tasks[self.order[self.cursor]])
            self.cursor += 1
        return out

    async def proxy_for(self, version: int) -> Proxy:
        proxy = self.proxies.get(version)
        if proxy is None:
            proxy = Proxy(self.server.url_for(version))
            await proxy.start()
            self.proxies[version] = proxy
        return proxy

    async def retire(self, keep: set[int]) -> None:
        for v in [v for v in self.proxies if v not in keep]:
            await self.proxies.pop(v).stop()
        for v in [v for v in self.policies if v not in keep and v != self.current.version]:
            del self.policies[v]
            self.server.retire_policy(v)

    async def rollouts(self, index: int, version: int) -> _Batch:
        batch = _Batch(index, version)
        proxy = await self.proxy_for(version)
        started = time.monotonic()

        async def one(task: Task, i: int) -> None:
            async with self.sem:
                ep = Episode(env=self.env.name, task_key=task.key, task=dict(task.data),
                             group_id=f"{self.run_key}/{index}/{task.key}", group_index=i,
                             run=self.run_key)
                ep.info[InfoKey.STEP] = index
                ep.info[InfoKey.POLICY_VERSION] = version
                await run_rollout(self.env, task, proxy=proxy, episode=ep, model=MODEL_NAME,
                                  sampling={"temperature": self.cfg.temperature,
                                            "top_p": self.cfg.top_p},
                                  seed=self.cfg.seed * 1_000_003 + index)
            await self.run.append(ep)
            batch.episodes.append(ep)
            reward = ep.reward
            for trace in ep.traces[:1]:
                batch.sampled_tokens += sum(n.end - n.start for n in trace.nodes if n.sampled)
                built = assemble(trace, metadata={"policy_version": version, "step": index,
                                                  "episode": ep.id},
                                 group_id=ep.group_id, group_index=i)
                # the bytes a trainer collects from the session API, decoded as it would
                for s in decode_samples(encode_samples(built)):
                    batch.samples.append((s, reward, ep.group_id or ""))

        await asyncio.gather(*(one(t, i) for t in self._next_tasks()
                               for i in range(self.cfg.group_size)))
        batch.wall_s = time.monotonic() - started
        return batch

    def update(self, batch: _Batch, step: int) -> StepSummary:
        t0 = time.monotonic()
        cfg, cur = self.cfg, self.current
        eng, tpl = self.engine, self.template
        rewards = [r for _, r, _ in batch.samples]
        adv = group_advantages(rewards, [g for _, _, g in batch.samples])
        v = eng.tok.vocab_size
        d_bias, d_pair = np.zeros(v), np.zeros((v, v))
        d_rows: dict[Any, np.ndarray[Any, np.dtype[np.float64]]] = {}
        worst, kl_sum, n_tok, n_clip, ratio_max, dropped = 0.0, 0.0, 0, 0, 0.0, 0
        sampler = self.policies.get(batch.version)
        for (s, _, _), a in zip(batch.samples, adv, strict=True):
            if s.logprobs is None or sampler is None or cur.version - batch.version > \
                    cfg.max_staleness or not s.loss_mask[s.prompt_len:].any():
                dropped += 1
                continue
            now = rescore(eng, tpl, s.tokens, s.loss_mask, s.prompt_len, cur,
                          cfg.temperature, cfg.top_p, grad=True)
            old = now if sampler is cur else rescore(
                eng, tpl, s.tokens, s.loss_mask, s.prompt_len, sampler, cfg.temperature,
                cfg.top_p)
            rec = s.logprobs[now.positions].astype(np.float64)
            # the sampler reported float64 logprobs; the trace keeps them as float32
            diff = old.logprobs.astype(np.float32).astype(np.float64) - rec
            if diff.size:
                worst = max(worst, float(np.abs(diff).max()))
                r = diff
                kl_sum += float((np.exp(r) - 1.0 - r).sum())
            coef, ratio, clipped = pg_coefficients(now.logprobs, rec, float(a), cfg.clip)
            n_tok += int(coef.size)
            n_clip += int(clipped.sum())
            if ratio.size:
                ratio_max = max(ratio_max, float(ratio.max()))
            assert now.grads is not None
            contrib = coef[:, None] * now.grads
            d_bias += contrib.sum(axis=0)
            has_prev = now.prev >= 0
            np.add.at(d_pair, now.prev[has_prev], contrib[has_prev])
            for j, keys in enumerate(now.keys):
                for key in keys:
                    row = d_rows.get(key)
                    if row is None:
                        d_rows[key] = contrib[j].copy()
                    else:
                        row += contrib[j]
        scale = cfg.lr / max(n_tok, 1)
        norm = float(np.sqrt((d_bias ** 2).sum() + (d_pair ** 2).sum() + sum(
            (r ** 2).sum() for r in d_rows.values()))) / max(n_tok, 1)
        self.current = cur.updated(d_bias * scale, d_pair * scale, cur.version + 1,
                                   {k: r * scale for k, r in d_rows.items() if r.any()})
        self.policies[self.current.version] = self.current
        groups: dict[str, list[float]] = {}
        for ep in batch.episodes:
            groups.setdefault(ep.group_id or "", []).append(ep.reward)
        return StepSummary(
            step=step, policy_version=cur.version, sampled_by=batch.version,
            staleness=cur.version - batch.version, episodes=len(batch.episodes),
            reward_mean=float(np.mean([e.reward for e in batch.episodes]))
            if batch.episodes else 0.0,
            pass_at=_pass_at(groups), samples=len(batch.samples), tokens=n_tok,
            tokens_per_s=batch.sampled_tokens / batch.wall_s if batch.wall_s > 0 else 0.0,
            rollout_s=batch.wall_s, update_s=time.monotonic() - t0, mismatch_max=worst,
            mismatch_kl=kl_sum / max(n_tok, 1), ratio_max=ratio_max,
            clipped=n_clip / max(n_tok, 1), dropped=dropped, grad_norm=norm)


async def train(
    env: Environment | str, config: TrainConfig | None = None, *,
    out: str | Path | None = None, on_step: Callable[[StepSummary], None] | None = None,
    on_samples: Callable[[int, list[Sample]], None] | None = None,
    stop: asyncio.Event | None = None,
) -> TrainResult:
    """Train the built-in model on ``env`` for ``config.steps`` steps; the episodes are stored
    in a run (``out``, default ``runs/train-<env>-<time>``) with ``info.step`` and
    ``info.policy_version``, and the per-step summaries in its ``train_steps.jsonl``.
    ``on_samples(step, samples)`` sees each step's decoded samples before the update."""
    cfg = config or TrainConfig()
    if min(cfg.steps, cfg.group_size, cfg.tasks_per_step, cfg.concurrency) < 1 or \
            cfg.max_staleness < 0 or not cfg.lr > 0 or not 0 < cfg.temperature <= 2:
        raise ValueError("need steps, group size, tasks per step, concurrency >= 1, "
                         "max staleness >= 0, lr > 0 and 0 < temperature <= 2")
    env = load_environment(env)
    out_path = Path(out) if out is not None else Path("runs") / (
        f"train-{env.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    meta = {"env": env.name, "model": "tracewire-tiny", "kind": "train",
            "train": {k: getattr(cfg, k) for k in cfg.__dataclass_fields__}}
    run = await Run.create(out_path, meta=meta)
    server = ModelServer(seed=cfg.seed)
    status = RunStatus.COMPLETE
    steps: list[StepSummary] = []
    pending: deque[tuple[int, asyncio.Task[_Batch]]] = deque()
    trainer: _Trainer | None = None
    try:
        await server.start()
        trainer = _Trainer(env, cfg, run, server, out_path.name)
        launched = 0
        for step in range(cfg.steps):
            if stop is not None and stop.is_set():
                status = RunStatus.INTERRUPTED
                break
            while launched < cfg.steps and len(pending) <= cfg.max_staleness:
                version = trainer.current.version
                await trainer.proxy_for(version)  # here, so two batches never race to make it
                pending.append((version, asyncio.create_task(trainer.rollouts(launched, version))))
                launched += 1
            batch = await pending.popleft()[1]
            if on_samples is not None:
                on_samples(step, [smp for smp, _, _ in batch.samples])
            # rescoring and the gradient run in a thread: rollouts in flight keep going
            summary = await asyncio.to_thread(trainer.update, batch, step)
            server.set_policy(trainer.current)  # on the loop: the swap is one assignment
            steps.append(summary)
            line = orjson.dumps(summary.as_dict()) + b"\n"
            await asyncio.to_thread(_append, out_path / "train_steps.jsonl", line)
            await trainer.retire({trainer.current.version, *(v for v, _ in pending)})
            if on_step is not None:
                on_step(summary)
    except BaseException:
        status = RunStatus.INTERRUPTED
        raise
    finally:
        for _, t in pending:
            t.cancel()
        await asyncio.gather(*(t for _, t in pending), return_exceptions=True)
        if trainer is not None:
            await trainer.retire(set())
        await close_http_client()
        await server.stop()
        await run.close(status=status)
    assert trainer is not None
    return TrainResult(out_path, steps, trainer.current, status)


def _append(path: Path, line: bytes) -> None:
    with path.open("ab") as f:
        f.write(line)
