"""``tracewire proxy`` as the composition root wires it: token-in/token-out on request."""

from __future__ import annotations

import argparse

from ..proxy import ProxyConfig, Upstream, UpstreamOptions, proxy_command
from ._options import DEFAULT_UPSTREAM_API, UPSTREAM_APIS
from ._tito import make_upstream

__all__ = ["PROXY_COMMAND", "TOKEN_IN_UPSTREAM"]


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tokenizer", default=None, metavar="DIR|FILE.gguf",
                        help="local tokenizer directory or GGUF model file: render prompts "
                             "here and send token ids (token-in/token-out; needs "
                             "tracewire[tito]). Default: pass-through chat")
    parser.add_argument("--upstream-api", choices=UPSTREAM_APIS, default=DEFAULT_UPSTREAM_API,
                        help="token-in endpoint with --tokenizer: vLLM /v1/completions, vLLM "
                             "/inference/v1/generate, SGLang /generate or llama-server "
                             "/completion")
    parser.add_argument("--model", default="", help="model name sent upstream (token-in)")


def _make(url: str, config: ProxyConfig, args: argparse.Namespace) -> str | Upstream:
    return make_upstream(url, config, model=args.model, tokenizer=args.tokenizer,
                         upstream_api=args.upstream_api)


#: The proxy command's token-in/token-out options and the upstream they select.
TOKEN_IN_UPSTREAM = UpstreamOptions(configure=_configure, make=_make)
#: The proxy building a token-in/token-out upstream when given ``--tokenizer``.
PROXY_COMMAND = proxy_command(TOKEN_IN_UPSTREAM)
