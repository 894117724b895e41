"""Which upstream a proxy gets: the chat pass-through (a URL), or token-in/token-out when a
tokenizer directory is configured.

Here, in the composition root, because ``tito`` imports ``proxy``: the proxy itself must
not import ``tito``. ``tito`` (and ``transformers``, the ``tracewire[tito]`` extra) loads
only when a tokenizer is asked for.
"""

from __future__ import annotations

from ..proxy import ProxyConfig, Upstream

__all__ = ["make_upstream"]


def make_upstream(url: str, config: ProxyConfig | None = None, *, model: str = ""
                  ) -> str | Upstream:
    """``url`` itself (pass-through) unless ``config.tokenizer`` names a tokenizer
    directory; then a :class:`~tracewire.tito.TokenUpstream` over the server at ``url``
    (a trailing ``/v1`` is dropped: the token-in endpoints have their own paths)."""
    if config is None or not config.tokenizer:
        return url
    from ..tito import TokenUpstream
    from ..tito.codecs import UpstreamApi

    base = url.rstrip("/")
    if base.endswith("/v1"):
        base = base[:-3]
    return TokenUpstream(base, config.tokenizer, api=UpstreamApi(config.upstream_api),
                         model=model, timeout_s=config.upstream_timeout)
