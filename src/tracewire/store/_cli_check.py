"""``tracewire check RUN [--repair]``: verify a stored run, and repair it on purpose."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .._command import Command
from .._errors import TracewireError

__all__ = ["CHECK_COMMAND", "HELP", "configure", "run"]

HELP = "Check a stored run (records decode, index rows match, no gaps); --repair fixes it."


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the check options."""
    parser.add_argument("run", type=Path, help="run directory")
    parser.add_argument(
        "--repair", action="store_true",
        help="truncate a torn tail, rewrite wrong index rows, store leftover journals as "
        "incomplete episodes (no writer may hold the run; intact records are never deleted)",
    )


def run(args: argparse.Namespace) -> int:
    """Run the check; exit status 0 when the run is sound (after repair, with --repair),
    1 when problems remain, 2 when the run cannot be opened."""
    from ._run import Run

    try:
        if args.repair:
            report = Run.repair(args.run)
        else:
            with Run.open(args.run) as r:
                report = r.verify()
    except (TracewireError, OSError) as exc:
        print(f"tracewire check: {exc}", file=sys.stderr)
        return 2
    print(report.text())
    if not report.ok and not args.repair and any(p.repairable for p in report.problems):
        print(f"run `tracewire check --repair {args.run}` to fix what can be fixed",
              file=sys.stderr)
    return 0 if report.ok else 1


#: ``tracewire check``.
CHECK_COMMAND = Command("check", HELP, configure, run)
