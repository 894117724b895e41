"""``tracewire proxy``: the proxy's own command, with its upstream chosen here (pass-through,
or token-in/token-out with ``--tokenizer``) since only the composition root may build a
token-in/token-out upstream."""

from __future__ import annotations

import argparse

from ..proxy import _cli
from ._tito import make_upstream

__all__ = ["HELP", "configure", "run"]

HELP = _cli.HELP
configure = _cli.configure


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted (see :func:`tracewire.proxy._cli.run`)."""
    return _cli.run(args, make_upstream=make_upstream)
