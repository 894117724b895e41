"""Command line: ``tracewire eval | demo | serve | proxy | engine | model | view | export |
import``.

Each sub-command lives in the part that owns it, as a module with ``HELP`` (one line),
``configure(parser)`` and ``run(args) -> int``; this file only wires them. A command's
module is imported only when the command runs (or ``--help`` lists them), so start-up
stays fast.
"""

from __future__ import annotations

import argparse
import functools
import gc
import sys
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Protocol

__all__ = ["COMMANDS", "Command", "main"]


class Command(Protocol):
    """What a sub-command's module provides."""

    HELP: str

    def configure(self, parser: argparse.ArgumentParser) -> None:
        """Add the command's arguments to ``parser``."""
        ...

    def run(self, args: argparse.Namespace) -> int:
        """Run the command; returns the process exit status."""
        ...


def _eval() -> Command:
    from .compose import _cli_eval

    return _cli_eval


def _demo() -> Command:
    from .compose import _cli_demo

    return _cli_demo


def _model() -> Command:
    from .model import _cli

    return _cli


def _train() -> Command:
    from .train import _cli

    return _cli


def _engine() -> Command:
    from .engine import _cli

    return _cli


def _proxy() -> Command:
    from .compose import make_upstream
    from .proxy import _cli

    # The composition root builds the upstream (token-in/token-out with --tokenizer); the
    # proxy never imports tito itself.
    cmd: Command = SimpleNamespace(HELP=_cli.HELP, configure=_cli.configure,
                                   run=functools.partial(_cli.run, make_upstream=make_upstream))
    return cmd


def _serve() -> Command:
    from .serve import _cli

    return _cli


def _view() -> Command:
    from .view import _cli

    return _cli


def _export() -> Command:
    from .store import _cli_export

    return _cli_export


def _check() -> Command:
    from .store import _cli_check

    return _cli_check


def _import() -> Command:
    from .store import _cli_import

    return _cli_import


#: Sub-command name -> loader of the module implementing it.
COMMANDS: dict[str, Callable[[], Command]] = {
    "eval": _eval,
    "demo": _demo,
    "model": _model,
    "train": _train,
    "proxy": _proxy,
    "engine": _engine,
    "serve": _serve,
    "view": _view,
    "export": _export,
    "check": _check,
    "import": _import,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen sub-command; returns the process exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="tracewire", description="Token-exact recording of LLM agent rollouts."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = argv[0] if argv and not argv[0].startswith("-") else None
    for name, load in COMMANDS.items():
        if chosen is not None and name != chosen:
            sub.add_parser(name)
            continue
        command = load()
        p = sub.add_parser(name, help=command.HELP, description=command.HELP)
        if chosen == name:
            command.configure(p)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    command = COMMANDS[args.command]()
    # Everything imported so far lives as long as the process: take it out of the garbage
    # collector's reach, so a full collection scans only what the command creates (full
    # passes over the start-up objects otherwise stall the event loop).
    if not getattr(args, "tokenizer", None):
        gc.freeze()
        return int(command.run(args))
    # Every command given --tokenizer: a bad path or a missing extra is one line and exit 2
    # before anything starts, and so is a tokenizer that fails to load later. (Only then is
    # tito imported: it costs other commands ~0.2 s.)
    from .tito import check_tokenizer
    from .tito._errors import TemplateError, TitoUnavailableError

    gc.freeze()
    try:
        check_tokenizer(args.tokenizer)
        return int(command.run(args))
    except (TemplateError, TitoUnavailableError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"tracewire {args.command}: {first}", file=sys.stderr)
        return 2
