"""``tracewire export RUN --format jsonl|parquet [--out FILE] [--samples]``; the file goes
beside the run unless ``--out`` names one, and its path is printed."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .._errors import TracewireError

HELP = "Export a stored run as JSONL episodes or a Parquet index (and branch samples)."


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the export options."""
    parser.add_argument("run", type=Path, help="run directory")
    parser.add_argument("--format", choices=("jsonl", "parquet"), default="jsonl")
    parser.add_argument("--out", help="output file (default: <run name>.<ext> beside the run "
                        "directory; '-' = stdout for jsonl)")
    parser.add_argument("--samples", action="store_true",
                        help="parquet: also write one row per branch to <out>.samples.parquet")
    parser.add_argument("--status", help="only episodes with this status")


def beside(run_dir: Path, ext: str) -> Path:
    """``<run dir's parent>/<run name><ext>``: next to the run, whatever the cwd is."""
    resolved = run_dir.resolve()
    return resolved.parent / f"{resolved.name}{ext}"


def run(args: argparse.Namespace) -> int:
    """Run the export; returns the exit status."""
    from ._export import export_jsonl, export_parquet
    from ._run import open_run

    filters = {"status": args.status} if args.status else {}
    try:
        with open_run(args.run) as r:
            if args.format == "jsonl":
                if args.out == "-":
                    n = export_jsonl(r, sys.stdout.buffer, **filters)
                    print(f"exported {n} episodes", file=sys.stderr)
                    return 0
                out = Path(args.out) if args.out else beside(args.run, ".jsonl")
                with open(out, "wb") as f:
                    n = export_jsonl(r, f, **filters)
                print(f"exported {n} episodes to {out}", file=sys.stderr)
            else:
                out = Path(args.out) if args.out else beside(args.run, ".parquet")
                files = export_parquet(r, out, samples=args.samples, **filters)
                print("wrote " + ", ".join(str(p) for p in files), file=sys.stderr)
    except (TracewireError, OSError) as exc:
        print(f"tracewire export: {exc}", file=sys.stderr)
        return 1
    return 0
