"""``tracewire model``: run the built-in demo model server until interrupted."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

from .._errors import ModelError
from ._protocol import MAX_MODEL_LEN, MODEL_NAME
from ._server import ModelServer

__all__ = ["HELP", "configure", "run"]

HELP = (f"Serve the built-in tiny demo model ({MODEL_NAME}) over an OpenAI/vLLM-compatible "
        "HTTP API. For tests and demos only: not a useful assistant.")


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``model`` sub-command's options."""
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port (default 0: a free port)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed for requests that give none (default 0)")
    parser.add_argument("--max-model-len", type=int, default=MAX_MODEL_LEN,
                        help=f"context length in tokens, prompt + completion (default "
                             f"{MAX_MODEL_LEN}); agents with long system prompts need more")
    parser.add_argument("--tokenizer", metavar="DIR|FILE.gguf", default=None,
                        help="serve over this local tokenizer directory (tokenizer.json + "
                             "tokenizer_config.json with its chat_template) or GGUF model "
                             "file instead of the built-in vocabulary; needs the "
                             "tracewire[tito] extra for chat")
    parser.add_argument("--non-canonical", metavar="P", type=float, nargs="?", const=0.5,
                        default=0.0,
                        help="with --tokenizer: split each multi-character token into its "
                             "per-character pieces with probability P (default when given: "
                             "0.5), to smoke-test non-canonical tokenizations")


async def _serve(args: argparse.Namespace) -> None:
    server = ModelServer(args.host, args.port, args.seed, args.max_model_len,
                         tokenizer=args.tokenizer, non_canonical=args.non_canonical)
    await server.start()
    print(server.base_url, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await server.stop()


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM; prints the base URL on its own line once listening.
    A bad option or tokenizer directory is one line on stderr and exit status 2."""
    try:
        asyncio.run(_serve(args))
    except ModelError as exc:
        print(f"tracewire model: {exc}", file=sys.stderr)
        return 2
    return 0
