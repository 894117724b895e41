"""``tracewire serve`` as the composition root wires it: real environments by default."""

from __future__ import annotations

from ..serve import serve_command
from ._envrunner import env_factory

__all__ = ["SERVE_COMMAND"]

#: The env server running ``tracewire.env`` environments (the stand-in needs no factory).
SERVE_COMMAND = serve_command(env_factory)
