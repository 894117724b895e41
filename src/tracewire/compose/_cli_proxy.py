"""``tracewire proxy`` as the composition root wires it: token-in/token-out on request."""

from __future__ import annotations

from ..proxy import proxy_command
from ._tito import make_upstream

__all__ = ["PROXY_COMMAND"]

#: The proxy building a token-in/token-out upstream when given ``--tokenizer``.
PROXY_COMMAND = proxy_command(make_upstream)
