"""Proxy configuration: bounds, timeouts, per-session limits, token fields and hooks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._session import Session

__all__ = ["ProxyConfig", "RequestHook", "ResponseHook"]

#: ``hook(session, endpoint, body)``: inspect or rewrite the chat-completions request body
#: sent upstream; return a new dict to replace it, or None to keep it.
RequestHook = Callable[["Session", str, dict[str, Any]], "dict[str, Any] | None"]
#: ``hook(session, endpoint, response)``: inspect or rewrite the (non-streamed) chat
#: completion before it is recorded and returned; return a new dict, or None to keep it.
ResponseHook = Callable[["Session", str, dict[str, Any]], "dict[str, Any] | None"]


def _token_fields() -> dict[str, Any]:
    return {"return_token_ids": True, "logprobs": True}


@dataclass
class ProxyConfig:
    """Tunables of a :class:`~tracewire.proxy.Proxy`; every bound has a finite default."""

    #: Largest request body accepted (screenshot-heavy agents send big bodies).
    max_body_bytes: int = 64 * 1024 * 1024
    #: Total seconds one upstream call may take.
    upstream_timeout: float = 600.0
    #: Seconds of upstream silence before a keepalive is sent on a streamed response.
    keepalive_s: float = 10.0
    #: Most live sessions at once; creating more raises ``LimitError``.
    max_sessions: int = 10_000
    #: Default per-session bound on committed turns (None: unbounded).
    max_turns: int | None = None
    #: Default per-session bound on a turn's prompt + completion tokens (None: unbounded).
    max_tokens: int | None = None
    #: Seconds a session lives after its last use.
    session_ttl_s: float = 3600.0
    #: Fields added to every upstream request to get token ids and logprobs back
    #: (vLLM style by default; ``{}`` for hosted APIs that reject unknown fields).
    token_fields: dict[str, Any] = field(default_factory=_token_fields)
    #: Bearer token sent to the upstream (hosted APIs); the harness's secret never is.
    upstream_api_key: str | None = None
    #: Request bodies above this size are parsed and hashed in a worker thread; an
    #: upstream given as a URL gets it for its replies (an Upstream object keeps its own).
    thread_threshold_bytes: int = 256 * 1024
    #: Most upstream connections at once (across all sessions).
    upstream_connections: int = 1024
    #: Raise this process's glibc mmap/trim thresholds when the proxy starts (see
    #: :func:`tracewire._memory.tune_allocator`): request and upstream bodies of long
    #: sessions then reuse heap memory instead of page-faulting fresh mmaps every turn. It
    #: affects the whole process and keeps up to 256 MiB of freed heap; False opts out.
    tune_memory: bool = True
    #: The trainer token every ``/sessions`` route requires (``Authorization: Bearer``).
    #: None: ``TRACEWIRE_SESSION_TOKEN`` when set, else one generated at start-up.
    session_token: str | None = None
    request_hooks: list[RequestHook] = field(default_factory=list)
    response_hooks: list[ResponseHook] = field(default_factory=list)
