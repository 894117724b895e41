"""``tracewire demo``: a short eval of the multi-turn ``guess`` env with the built-in model."""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
from pathlib import Path

from . import _cli_eval

HELP = "Evaluate the bundled guess-the-number env with the built-in model (a few seconds)."

__all__ = ["HELP", "configure", "run"]


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


def command_name() -> str:
    """How the user's shell reaches this tracewire: ``tracewire`` when that is on PATH and is
    this environment's, else that script's path (relative when under the current
    directory, e.g. ``.venv/bin/tracewire``), else ``PYTHON -m tracewire``."""
    script = Path(sys.executable).parent / "tracewire"  # unresolved: the venv's bin
    if not script.is_file():
        return f"{sys.executable} -m tracewire"
    on_path = shutil.which("tracewire")
    if on_path is not None and os.path.samefile(on_path, script):
        return "tracewire"
    try:
        return str(script.absolute().relative_to(Path.cwd()))
    except ValueError:
        return str(script)


def run(args: argparse.Namespace) -> int:
    """Run the demo eval, then say how to view and export the run."""
    code, run_dir = asyncio.run(_cli_eval.run_cli(eval_args(args)))
    if code in (0, 130):
        from rich.console import Console

        console = Console()
        run_dir = run_dir or "RUN_DIR"
        prog = command_name()
        # soft_wrap: a command the user copies must stay on one line.
        console.print(f"\nOpen the viewer:   [bold]{prog} view {run_dir}[/bold]",
                      soft_wrap=True)
        console.print(f"Export the run:    [bold]{prog} export {run_dir} --format jsonl"
                      "[/bold]", soft_wrap=True)
        if prog != "tracewire" and prog.endswith("bin/tracewire"):
            activate = os.path.join(os.path.dirname(prog), "activate")
            console.print(f"(or `source {activate}` once, then `tracewire ...`)",
                          soft_wrap=True)
    return code
