"""``tracewire serve`` as the composition root wires it: real environments by default, with
the model server and token-in/token-out options the env factory reads."""

from __future__ import annotations

import argparse
from typing import Any

from ..serve import RunnerOptions, serve_command
from ._envrunner import env_factory
from ._options import UPSTREAM_APIS

__all__ = ["ENV_MODEL_OPTIONS", "SERVE_COMMAND"]


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--base-url", default=None,
                        help="model server for real environments (default: built-in model)")
    parser.add_argument("--tokenizer", default=None, metavar="DIR|FILE.gguf",
                        help="token-in/token-out with this local tokenizer directory or GGUF "
                             "model file")
    parser.add_argument("--upstream-api", choices=UPSTREAM_APIS, default=None,
                        help="token-in endpoint with --tokenizer")


def _read(args: argparse.Namespace) -> dict[str, Any]:
    # Only what was given: env_factory's own defaults stand for the rest.
    out: dict[str, Any] = {}
    if args.base_url:
        out["base_url"] = args.base_url
    if args.tokenizer:
        out["tokenizer"] = args.tokenizer
    if args.upstream_api:
        out["upstream_api"] = args.upstream_api
    return out


#: The serve command's model options (``--base-url``, ``--tokenizer``, ``--upstream-api``)
#: and the runner factory options they set.
ENV_MODEL_OPTIONS = RunnerOptions(configure=_configure, read=_read)
#: The env server running ``tracewire.env`` environments (the stand-in needs no factory).
SERVE_COMMAND = serve_command(env_factory, ENV_MODEL_OPTIONS)
