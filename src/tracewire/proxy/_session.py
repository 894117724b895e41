"""Sessions (one per rollout, each with its own secret) and their bounded registry."""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

from .._errors import LimitError, SessionError
from ..sessions import GoneReason, SessionStatus
from ..trace import StopReason, Trace, new_id
from ._graph import TurnGraph

__all__ = ["Session", "SessionRegistry"]

_TOMBSTONES = 100_000
_RETRY_CACHE = 8
_SAYS = {GoneReason.NEVER_EXISTED: "never existed", GoneReason.EXPIRED: "expired",
         GoneReason.DELETED: "was deleted"}


class Session:
    """One rollout's view of the proxy: identity, secret, the trace it records into, limits."""

    def __init__(
        self,
        *,
        proxy_url: str,
        trace: Trace | None = None,
        metadata: dict[str, Any] | None = None,
        ttl: float = 3600.0,
        group_id: str | None = None,
        group_index: int = 0,
        max_turns: int | None = None,
        max_tokens: int | None = None,
    ) -> None:
        self.id: str = new_id()
        self.secret: str = "tw-" + secrets.token_urlsafe(24)
        self.trace: Trace = trace if trace is not None else Trace()
        self.metadata: dict[str, Any] = metadata or {}
        self.group_id = group_id
        self.group_index = group_index
        self.created: float = time.time()
        self.last_used: float = self.created
        self.status = SessionStatus.ACTIVE
        self.ttl = ttl
        self.max_turns = max_turns
        self.max_tokens = max_tokens
        #: Turns committed through this session, and the last turn's prompt+completion size.
        self.turns = 0
        self.last_total_tokens = 0
        self.graph = TurnGraph(self.trace)
        #: Tool-call id -> the exact arguments text the model produced, so dialects that
        #: echo tool calls back as objects can send the sampled text upstream again.
        self.tool_args: dict[str, str] = {}
        self._proxy_url = proxy_url
        # Recently committed answers by retry key, so SDK retries do not commit twice.
        self._answers: OrderedDict[str, Any] = OrderedDict()

    def __repr__(self) -> str:
        return f"Session(id={self.id!r}, status={self.status!r}, turns={self.turns})"

    @property
    def base_url(self) -> str:
        """Base URL for OpenAI SDKs (``{proxy}/sessions/{id}/v1``)."""
        return f"{self._proxy_url}/sessions/{self.id}/v1"

    @property
    def anthropic_base_url(self) -> str:
        """Base URL for the Anthropic SDK (``{proxy}/sessions/{id}``)."""
        return f"{self._proxy_url}/sessions/{self.id}"

    def expired(self, now: float | None = None) -> bool:
        """True when the session has been idle longer than its TTL."""
        return (time.time() if now is None else now) - self.last_used > self.ttl

    def touch(self) -> None:
        """Mark the session used now."""
        self.last_used = time.time()

    def limit_reached(self) -> StopReason | None:
        """``MAX_TURNS``/``MAX_TOKENS`` when the session is at that bound, else None."""
        if self.max_turns is not None and self.turns >= self.max_turns:
            return StopReason.MAX_TURNS
        if self.max_tokens is not None and self.last_total_tokens >= self.max_tokens:
            return StopReason.MAX_TOKENS
        return None

    def remember(self, key: str, answer: Any) -> None:
        """Keep a committed answer for retries of the same request (a few per session)."""
        self._answers[key] = answer
        while len(self._answers) > _RETRY_CACHE:
            self._answers.popitem(last=False)

    def recall(self, key: str) -> Any:
        """The answer remembered under ``key``, or None."""
        return self._answers.get(key)


class SessionRegistry:
    """Live sessions by id and by secret, bounded, with TTL expiry and tombstones that let
    lookups say why a session is gone."""

    def __init__(self, max_sessions: int = 10_000) -> None:
        self.max_sessions = max_sessions
        self._by_id: dict[str, Session] = {}
        self._by_secret: dict[str, Session] = {}
        self._gone: OrderedDict[str, GoneReason] = OrderedDict()

    def __len__(self) -> int:
        return len(self._by_id)

    def __iter__(self) -> Iterator[Session]:
        return iter(list(self._by_id.values()))

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._by_id

    def add(self, session: Session) -> Session:
        """Register a session; ``LimitError`` when the registry is full."""
        if len(self._by_id) >= self.max_sessions:
            self.sweep()
            if len(self._by_id) >= self.max_sessions:
                raise LimitError(f"too many sessions (max_sessions={self.max_sessions})")
        self._by_id[session.id] = session
        self._by_secret[session.secret] = session
        return session

    def get(self, session_id: str) -> Session:
        """The live session ``session_id``; ``SessionError`` says whether it never existed,
        expired or was deleted."""
        s = self._by_id.get(session_id)
        if s is not None and s.expired():
            self._drop(s, GoneReason.EXPIRED)
            s = None
        if s is None:
            why = self._gone.get(session_id, GoneReason.NEVER_EXISTED)
            raise SessionError(f"session {session_id!r} {_SAYS[why]}", reason=why)
        return s

    def by_secret(self, secret: str) -> Session | None:
        """The live session holding ``secret``, or None."""
        s = self._by_secret.get(secret)
        if s is not None and s.expired():
            self._drop(s, GoneReason.EXPIRED)
            return None
        return s

    def delete(self, session_id: str) -> Session:
        """Close and forget a session; ``SessionError`` if it is not live."""
        s = self.get(session_id)
        self._drop(s, GoneReason.DELETED)
        return s

    def sweep(self) -> int:
        """Drop every expired session; returns how many."""
        now = time.time()
        dead = [s for s in self._by_id.values() if s.expired(now)]
        for s in dead:
            self._drop(s, GoneReason.EXPIRED)
        return len(dead)

    def _drop(self, s: Session, why: GoneReason) -> None:
        s.status = SessionStatus.CLOSED
        self._by_id.pop(s.id, None)
        self._by_secret.pop(s.secret, None)
        self._gone[s.id] = why
        while len(self._gone) > _TOMBSTONES:
            self._gone.popitem(last=False)
