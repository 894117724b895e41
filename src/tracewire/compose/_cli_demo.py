"""``tracewire demo``: a short eval of the multi-turn ``guess`` env with the built-in model."""

from __future__ import annotations

import argparse
import asyncio

from .._command import Command
from . import _cli_eval

HELP = "Evaluate the bundled guess-the-number env with the built-in model (a few seconds)."

__all__ = ["DEMO_COMMAND", "HELP", "configure", "run"]


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``demo`` arguments."""
    parser.add_argument("--out", help="run directory (default: runs/guess-<timestamp>)")
    parser.add_argument("-n", "--tasks", dest="n", type=int, default=12, help="tasks (12)")
    parser.add_argument("-r", "--rollouts", dest="r", type=int, default=4,
                        help="rollouts per task (4)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (0)")


def eval_args(args: argparse.Namespace) -> argparse.Namespace:
    """The ``tracewire eval`` arguments the demo amounts to (every other option at its
    default)."""
    parser = argparse.ArgumentParser(add_help=False)
    _cli_eval.configure(parser)
    argv = ["guess", "-n", str(args.n), "-r", str(args.r), "-c", "16", "--seed", str(args.seed)]
    if args.out is not None:
        argv += ["--out", str(args.out)]
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> int:
    """Run the demo eval, then say how to view and export the run."""
    code, run_dir = asyncio.run(_cli_eval.run_cli(eval_args(args)))
    if code in (0, 130):
        from rich.console import Console

        console = Console()
        run_dir = run_dir or "RUN_DIR"
        console.print(f"\nOpen the viewer:   [bold]tracewire view {run_dir}[/bold]")
        console.print(f"Export the run:    [bold]tracewire export {run_dir} --format jsonl"
                      "[/bold]")
    return code


#: ``tracewire demo``.
DEMO_COMMAND = Command("demo", HELP, configure, run)
