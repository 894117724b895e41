"""Errors of the token-in/token-out part, each under the project's one error tree.

They live here (not in ``tracewire._errors``) until the lead folds them in; each carries the
HTTP status the proxy answers the harness with. The tokenizer's own two (``TemplateError``,
``TitoUnavailableError``) are ``tracewire.tokens``', named here too.
"""

from __future__ import annotations

from .._errors import ProxyError, UpstreamError
from ..tokens import TemplateError, TitoUnavailableError

__all__ = ["BridgeError", "TemplateError", "TitoUnavailableError", "TruncatedTurnError",
           "UpstreamShapeError"]


class BridgeError(ProxyError, ValueError):
    """The new messages cannot be appended to the recorded ids (the template does not render
    them as a string extension of a fixed prefix); ``reason`` names why, and the caller falls
    back to a full re-render on a new branch."""

    def __init__(self, message: str = "", reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason


class TruncatedTurnError(ProxyError, ValueError):
    """A turn that ended by length (no close token) cannot be extended under the refuse rule;
    answered 409 as the session servers users know do."""

    status = 409


class UpstreamShapeError(UpstreamError):
    """A token-in/token-out call that cannot be served or recorded: a reply whose logprob
    count differs from its completion length or whose ids are missing (502, never recorded),
    the server's own 4xx, or a request refused before it is sent (``status``)."""

    def __init__(self, message: str = "", status: int = 502) -> None:
        # Set here too: works whether or not UpstreamError takes a status yet.
        super().__init__(message)
        self.status = status
