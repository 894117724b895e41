"""``tracewire import FILE.jsonl [--run DIR]``: load a JSONL export back into a run."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from .._command import Command
from .._errors import TracewireError
from ._status import FsyncPolicy

__all__ = ["HELP", "IMPORT_COMMAND", "configure", "run"]

HELP = "Import a JSONL export (one episode per line) into a run directory."


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the import options."""
    parser.add_argument("file", type=Path, help="JSONL file from `tracewire export`")
    parser.add_argument("--run", type=Path, help="run directory (default: runs/<file stem>)")
    parser.add_argument("--fsync", choices=tuple(FsyncPolicy),
                        default=FsyncPolicy.INTERVAL.value)


def run(args: argparse.Namespace) -> int:
    """Run the import; returns the exit status."""
    from ._export import import_jsonl

    dest = args.run or Path("runs") / args.file.stem
    try:
        n = asyncio.run(import_jsonl(args.file, dest, fsync=args.fsync))
    except (TracewireError, OSError) as exc:
        print(f"tracewire import: {exc}", file=sys.stderr)
        return 1
    print(f"imported {n} episodes into {dest}", file=sys.stderr)
    return 0


#: ``tracewire import``.
IMPORT_COMMAND = Command("import", HELP, configure, run)
