"""``tracewire train ENV``: train the built-in model on an environment, one line per step."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from typing import Any

from .._command import Command
from .._errors import TracewireError
from ..store import RunStatus

HELP = ("Train the built-in model on an environment with an RL loop on CPU (group rollouts "
        "through the proxy, policy-gradient updates, live weight swaps).")

__all__ = ["COMMAND", "HELP", "configure", "run"]


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``train`` arguments."""
    parser.add_argument("env", metavar="ENV",
                        help="bundled name (arithmetic, tools, guess, command), entry point, "
                             "module path (pkg.mod[:attr]) or .py file")
    parser.add_argument("--steps", type=int, default=20, help="policy updates (default 20)")
    parser.add_argument("--group-size", type=int, default=8,
                        help="rollouts per task, one advantage group (default 8)")
    parser.add_argument("--tasks-per-step", type=int, default=4,
                        help="tasks in each step's batch (default 4)")
    parser.add_argument("-n", "--tasks", dest="n_tasks", type=int, default=None,
                        help="train on the first N tasks only (default: all)")
    parser.add_argument("--lr", type=float, default=10.0, help="learning rate (default 10)")
    parser.add_argument("--max-staleness", type=int, default=0,
                        help="batches rolled out ahead on older weights (default 0: on-policy)")
    parser.add_argument("--clip", type=float, default=0.2,
                        help="importance-ratio clip (default 0.2)")
    parser.add_argument("--temperature", type=float, default=1.0,
                        help="sampling temperature (default 1)")
    parser.add_argument("-c", "--concurrency", type=int, default=16,
                        help="rollouts in flight (default 16)")
    parser.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    parser.add_argument("--out", help="run directory (default: runs/train-<env>-<timestamp>)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no per-step lines")


def _line(s: Any) -> str:
    pass_at = " ".join(f"@{k} {v:.2f}" for k, v in s.pass_at.items())
    return (f"step {s.step:>3}  v{s.sampled_by} (stale {s.staleness})  reward {s.reward_mean:.3f}"
            f"  pass {pass_at or '-'}  {s.tokens_per_s:,.0f} tok/s  mismatch max "
            f"{s.mismatch_max:.2g} kl {s.mismatch_kl:.2g}  clipped {s.clipped:.0%}"
            f"  {s.rollout_s + s.update_s:.1f} s")


async def _main(args: argparse.Namespace) -> int:
    from ._loop import TrainConfig, train

    cfg = TrainConfig(steps=args.steps, group_size=args.group_size,
                      tasks_per_step=args.tasks_per_step, lr=args.lr,
                      max_staleness=args.max_staleness, clip=args.clip,
                      temperature=args.temperature, concurrency=args.concurrency,
                      seed=args.seed, n_tasks=args.n_tasks)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        result = await train(args.env, cfg, out=args.out, stop=stop,
                             on_step=None if args.quiet else lambda s: print(_line(s),
                                                                             flush=True))
    except (TracewireError, ValueError, OSError) as exc:
        print(f"tracewire train: {str(exc).splitlines()[0] if str(exc) else exc!r}",
              file=sys.stderr)
        return 1
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    steps = result.steps
    if steps:
        k = max(1, len(steps) // 5)
        first = sum(s.reward_mean for s in steps[:k]) / k
        last = sum(s.reward_mean for s in steps[-k:]) / k
        worst = max(s.mismatch_max for s in steps)
        tok = sum(s.tokens_per_s for s in steps) / len(steps)
        print(f"{result.status}: {len(steps)} steps, reward {first:.3f} -> {last:.3f} (mean of "
              f"the first/last {k}), max mismatch {worst:.2g}, {tok:,.0f} sampled tok/s")
    print(f"run: {result.run_dir}")
    return 130 if result.status == RunStatus.INTERRUPTED else 0


def run(args: argparse.Namespace) -> int:
    """Entry point of ``tracewire train``."""
    return asyncio.run(_main(args))


#: ``tracewire train``.
COMMAND = Command("train", HELP, configure, run)
