"""``tracewire proxy``: run the interception proxy standalone."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable

from .._errors import ProxyError
from ..sessions import read_token_file
from ._config import ProxyConfig
from ._server import Proxy
from ._upstream_api import Upstream

#: ``make(url, config, model=...)``: the upstream for ``url`` (the URL itself: pass-through).
UpstreamFactory = Callable[..., "str | Upstream"]

__all__ = ["HELP", "configure", "run"]

HELP = "Run the interception proxy in front of an OpenAI-compatible upstream."


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the proxy's options."""
    parser.add_argument("--upstream", required=True, help="upstream base URL, e.g. http://h:8000/v1")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--max-body-mb", type=float, default=64.0)
    parser.add_argument("--upstream-timeout", type=float, default=600.0)
    parser.add_argument("--no-token-fields", action="store_true",
                        help="do not ask the upstream for token ids (hosted APIs)")
    parser.add_argument("--tokenizer", default=None, metavar="DIR|FILE.gguf",
                        help="local tokenizer directory or GGUF model file: render prompts "
                             "here and send token ids (token-in/token-out; needs "
                             "tracewire[tito]). Default: pass-through chat")
    parser.add_argument("--upstream-api",
                        choices=("completions", "generate", "sglang", "llamacpp"),
                        default="completions",
                        help="token-in endpoint with --tokenizer: vLLM /v1/completions, vLLM "
                             "/inference/v1/generate, SGLang /generate or llama-server "
                             "/completion")
    parser.add_argument("--model", default="", help="model name sent upstream (token-in)")
    tok = parser.add_mutually_exclusive_group()
    tok.add_argument("--session-token", default=None,
                     help="trainer token of the /sessions API (visible to every local user "
                          "in the process list: prefer --session-token-file; default: "
                          "$TRACEWIRE_SESSION_TOKEN, else generated and printed)")
    tok.add_argument("--session-token-file", default=None, metavar="PATH",
                     help="read the trainer token from PATH (one line; the file must not be "
                          "readable by group or others)")


async def _serve(args: argparse.Namespace, make_upstream: UpstreamFactory | None) -> None:
    token = args.session_token
    if getattr(args, "session_token_file", None):
        token = read_token_file(args.session_token_file)
    cfg = ProxyConfig(max_body_bytes=int(args.max_body_mb * 1024 * 1024),
                      upstream_timeout=args.upstream_timeout,
                      session_token=token, tokenizer=args.tokenizer,
                      upstream_api=args.upstream_api)
    if args.no_token_fields:
        cfg.token_fields = {}
    if cfg.tokenizer and make_upstream is None:
        raise SystemExit("--tokenizer needs an upstream factory (the `tracewire proxy` "
                         "command passes one)")
    upstream = (make_upstream(args.upstream, cfg, model=args.model) if make_upstream
                else args.upstream)
    async with Proxy(upstream, host=args.host, port=args.port, config=cfg) as proxy:
        print(proxy.url, flush=True)
        if proxy.session_token_generated:
            print(f"TRACEWIRE_SESSION_TOKEN={proxy.session_token}", flush=True)
        await asyncio.Event().wait()


def run(args: argparse.Namespace, make_upstream: UpstreamFactory | None = None) -> int:
    """Serve until interrupted; prints the proxy's URL first, then the session token
    (``TRACEWIRE_SESSION_TOKEN=...``) when it was generated. ``make_upstream`` builds the
    upstream from the URL and config (the composition root passes one that honours
    ``--tokenizer``)."""
    try:
        asyncio.run(_serve(args, make_upstream))
    except KeyboardInterrupt:
        pass
    except ProxyError as exc:
        print(f"tracewire proxy: {exc}", file=sys.stderr)
        return 2
    return 0
