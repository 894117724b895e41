"""``tracewire proxy``: run the interception proxy standalone."""

from __future__ import annotations

import argparse
import asyncio
import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass

from .._command import Command
from .._errors import ProxyError
from ..sessions import read_token_file
from ._config import ProxyConfig
from ._server import Proxy
from ._upstream_api import Upstream

__all__ = ["COMMAND", "HELP", "UpstreamOptions", "configure", "proxy_command", "run"]

HELP = "Run the interception proxy in front of an OpenAI-compatible upstream."


@dataclass(frozen=True)
class UpstreamOptions:
    """How the composition root extends the command: options of its own (``--tokenizer``
    and the like), and the upstream built from ``--upstream``, the config and those
    options (the URL itself for the chat pass-through)."""

    configure: Callable[[argparse.ArgumentParser], None]
    make: Callable[[str, ProxyConfig, argparse.Namespace], str | Upstream]


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the proxy's options."""
    parser.add_argument("--upstream", required=True, help="upstream base URL, e.g. http://h:8000/v1")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--max-body-mb", type=float, default=64.0)
    parser.add_argument("--upstream-timeout", type=float, default=600.0)
    parser.add_argument("--no-token-fields", action="store_true",
                        help="do not ask the upstream for token ids (hosted APIs)")
    tok = parser.add_mutually_exclusive_group()
    tok.add_argument("--session-token", default=None,
                     help="trainer token of the /sessions API (visible to every local user "
                          "in the process list: prefer --session-token-file; default: "
                          "$TRACEWIRE_SESSION_TOKEN, else generated and printed)")
    tok.add_argument("--session-token-file", default=None, metavar="PATH",
                     help="read the trainer token from PATH (one line; the file must not be "
                          "readable by group or others)")


async def _serve(args: argparse.Namespace, upstream_options: UpstreamOptions | None) -> None:
    token = args.session_token
    if getattr(args, "session_token_file", None):
        token = read_token_file(args.session_token_file)
    cfg = ProxyConfig(max_body_bytes=int(args.max_body_mb * 1024 * 1024),
                      upstream_timeout=args.upstream_timeout, session_token=token)
    if args.no_token_fields:
        cfg.token_fields = {}
    upstream = (upstream_options.make(args.upstream, cfg, args) if upstream_options
                else args.upstream)
    async with Proxy(upstream, host=args.host, port=args.port, config=cfg) as proxy:
        print(proxy.url, flush=True)
        if proxy.session_token_generated:
            print(f"TRACEWIRE_SESSION_TOKEN={proxy.session_token}", flush=True)
        await asyncio.Event().wait()


def run(args: argparse.Namespace, upstream_options: UpstreamOptions | None = None) -> int:
    """Serve until interrupted; prints the proxy's URL first, then the session token
    (``TRACEWIRE_SESSION_TOKEN=...``) when it was generated. ``upstream_options`` builds the
    upstream (the composition root passes the one that adds ``--tokenizer``)."""
    try:
        asyncio.run(_serve(args, upstream_options))
    except KeyboardInterrupt:
        pass
    except ProxyError as exc:
        print(f"tracewire proxy: {exc}", file=sys.stderr)
        return 2
    return 0


def proxy_command(upstream_options: UpstreamOptions | None = None) -> Command:
    """The ``proxy`` command, its options and upstream extended by ``upstream_options`` (the
    composition root passes the ones that add token-in/token-out)."""
    def configure_all(parser: argparse.ArgumentParser) -> None:
        configure(parser)
        if upstream_options is not None:
            upstream_options.configure(parser)

    return Command("proxy", HELP, configure_all,
                   functools.partial(run, upstream_options=upstream_options))


#: ``tracewire proxy`` as a pass-through to ``--upstream`` (no ``--tokenizer``).
COMMAND = proxy_command()
