"""What a rollout needs from an interception proxy, as protocols the env part owns.

``tracewire.proxy.Proxy`` and its ``Session`` satisfy them; the composition root hands a
real proxy in, and a test may hand in anything with the same shape.
"""

from __future__ import annotations

from typing import Any, Protocol

from ..trace import Trace

__all__ = ["ProxyLike", "SessionLike", "SessionsLike"]


class SessionLike(Protocol):
    """One rollout's proxy session: where the agent sends its model calls, and with what."""

    @property
    def id(self) -> str:
        """The session id (recorded in ``trace.info["session"]``)."""
        ...

    @property
    def secret(self) -> str:
        """The per-session key the agent sends as its API key."""
        ...

    @property
    def trace(self) -> Trace:
        """The trace the proxy records the session's turns into."""
        ...

    @property
    def base_url(self) -> str:
        """Base URL for OpenAI SDKs (ends in ``/v1``)."""
        ...

    @property
    def anthropic_base_url(self) -> str:
        """Base URL for the Anthropic SDK."""
        ...


class SessionsLike(Protocol):
    """The proxy's live sessions, as far as ending one goes."""

    def delete(self, session_id: str) -> object:
        """End a session; ``LookupError`` when it is already gone."""
        ...


class ProxyLike(Protocol):
    """The parts of a proxy a rollout uses: making a session, and ending it afterwards."""

    def create_session(
        self,
        *,
        trace: Trace | None = ...,
        metadata: dict[str, Any] | None = ...,
        group_id: str | None = ...,
        group_index: int = ...,
    ) -> SessionLike:
        """A new session recording into ``trace``."""
        ...

    @property
    def registry(self) -> SessionsLike:
        """The live sessions."""
        ...
