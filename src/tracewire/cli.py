"""Command line: ``tracewire eval | demo | serve | proxy | engine | model | view | export |
import``.

Each sub-command is a public :class:`Command` of the part that owns it (``proxy`` and
``serve`` as the composition root wires them); this file only lists them. A command's part
is imported only when the command runs (or ``--help`` lists them), so start-up stays fast.
"""

from __future__ import annotations

import argparse
import gc
import sys
from collections.abc import Callable, Sequence

from ._command import Command

__all__ = ["COMMANDS", "Command", "main"]


def _eval() -> Command:
    from .compose import EVAL_COMMAND

    return EVAL_COMMAND


def _demo() -> Command:
    from .compose import DEMO_COMMAND

    return DEMO_COMMAND


def _model() -> Command:
    from .model import COMMAND

    return COMMAND


def _train() -> Command:
    from .train import COMMAND

    return COMMAND


def _engine() -> Command:
    from .engine import COMMAND

    return COMMAND


def _proxy() -> Command:
    from .compose import PROXY_COMMAND

    return PROXY_COMMAND


def _serve() -> Command:
    from .compose import SERVE_COMMAND

    return SERVE_COMMAND


def _view() -> Command:
    from .view import COMMAND

    return COMMAND


def _export() -> Command:
    from .store import EXPORT_COMMAND

    return EXPORT_COMMAND


def _check() -> Command:
    from .store import CHECK_COMMAND

    return CHECK_COMMAND


def _import() -> Command:
    from .store import IMPORT_COMMAND

    return IMPORT_COMMAND


#: Sub-command name -> loader of the command (the name matches the command's own).
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
        p = sub.add_parser(name, help=command.help, description=command.help)
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
    # the tokenizer core imported: it costs other commands ~0.2 s.)
    from .tokens import TemplateError, TitoUnavailableError, check_tokenizer

    gc.freeze()
    try:
        check_tokenizer(args.tokenizer)
        return int(command.run(args))
    except (TemplateError, TitoUnavailableError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"tracewire {args.command}: {first}", file=sys.stderr)
        return 2
