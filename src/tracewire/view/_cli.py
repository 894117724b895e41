"""``tracewire view RUN_DIR``: serve the web viewer of a run until interrupted."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys

from .._errors import StoreError

__all__ = ["HELP", "configure", "run"]

HELP = ("Serve the live web viewer of a run directory (loopback by default); a second run "
        "is offered for run-against-run.")


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``view`` arguments."""
    parser.add_argument("run_dir", metavar="RUN_DIR", help="run directory to view")
    parser.add_argument("other", metavar="RUN_B", nargs="*",
                        help="run(s) to compare it with, task by task (the first by default)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8765, help="port (default 8765; 0 = any)")
    parser.add_argument("--poll", type=float, default=0.25,
                        help="seconds between polls of in-flight episodes (default 0.25)")


async def _serve(args: argparse.Namespace) -> None:
    from ._server import ViewServer

    server = ViewServer(args.run_dir, host=args.host, port=args.port, poll_interval=args.poll,
                        compare=list(args.other))
    await server.start()
    print(f"tracewire view: serving {args.run_dir} at {server.url}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await server.stop()


def run(args: argparse.Namespace) -> int:
    """Serve until Ctrl-C; returns the exit status."""
    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(_serve(args))
    except (StoreError, OSError) as exc:
        print(f"tracewire view: {exc}", file=sys.stderr)
        return 1
    return 0
