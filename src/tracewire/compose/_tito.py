"""Which upstream a proxy gets: the chat pass-through (a URL), or token-in/token-out when a
tokenizer directory (or GGUF file) is given.

Here, in the composition root, because ``tito`` imports ``proxy``: the proxy itself must
not import ``tito``. ``tito`` (and ``transformers``, the ``tracewire[tito]`` extra) loads
only when a tokenizer is asked for.
"""

from __future__ import annotations

from ..proxy import ProxyConfig, Upstream
from ._options import DEFAULT_UPSTREAM_API

__all__ = ["make_upstream"]


def make_upstream(url: str, config: ProxyConfig | None = None, *, model: str = "",
                  tokenizer: str | None = None, upstream_api: str = DEFAULT_UPSTREAM_API
                  ) -> str | Upstream:
    """``url`` itself (pass-through) unless ``tokenizer`` names a tokenizer directory or
    GGUF file; then a :class:`~tracewire.tito.TokenUpstream` asking the server at ``url`` on
    its ``upstream_api`` endpoint (a ``tito.codecs.UpstreamApi`` value; a trailing ``/v1``
    is dropped, the token-in endpoints have their own paths) within ``config``'s timeout."""
    if not tokenizer:
        return url
    from ..tito import TokenUpstream
    from ..tito.codecs import UpstreamApi

    base = url.rstrip("/")
    if base.endswith("/v1"):
        base = base[:-3]
    timeout = (config or ProxyConfig()).upstream_timeout
    return TokenUpstream(base, tokenizer, api=UpstreamApi(upstream_api), model=model,
                         timeout_s=timeout)
