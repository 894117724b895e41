"""``tracewire demo``: a short eval of the multi-turn ``guess`` env with the built-in model."""

from __future__ import annotations

import argparse
import asyncio

HELP = "Evaluate the bundled guess-the-number env with the built-in model (a few seconds)."

__all__ = ["HELP", "configure", "run"]


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``demo`` arguments."""
    parser.add_argument("--out", help="run directory (default: runs/guess-<timestamp>)")
    parser.add_argument("-n", "--tasks", dest="n", type=int, default=12, help="tasks (12)")
    parser.add_argument("-r", "--rollouts", dest="r", type=int, default=4,
                        help="rollouts per task (4)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (0)")


def run(args: argparse.Namespace) -> int:
    """Run the demo eval, then say how to view and export the run."""
    from rich.console import Console

    from ._cli_eval import run_cli

    eval_args = argparse.Namespace(
        env="guess", model=None, base_url=None, api_key=None, n=args.n, r=args.r,
        concurrency=16, out=args.out, resume=False, seed=args.seed, temperature=None,
        max_tokens=None, quiet=False,
    )
    code = asyncio.run(run_cli(eval_args))
    if code in (0, 130):
        console = Console()
        run_dir = getattr(eval_args, "run_dir", None) or "RUN_DIR"
        console.print(f"\nOpen the viewer:   [bold]tracewire view {run_dir}[/bold]")
        console.print(f"Export the run:    [bold]tracewire export {run_dir} --format jsonl"
                      "[/bold]")
    return code
