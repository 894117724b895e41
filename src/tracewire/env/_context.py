"""What a harness and the per-task hooks see of one rollout, and helpers to read a trace."""

from __future__ import annotations

import asyncio
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..trace import Episode, Trace
from ._runtime import RuntimeLike
from ._session import SessionLike
from ._task import Task

if TYPE_CHECKING:
    from openai import AsyncOpenAI, DefaultAsyncHttpxClient


__all__ = [
    "EnvironmentInfo",
    "Rollout",
    "assistant_texts",
    "close_http_client",
    "final_text",
    "http_client",
]


# One HTTP client per event loop, shared by every rollout's SDK client: building one costs
# ~0.1-0.2 s (TLS context), far too much per rollout and far too long to block the loop.
_HTTP: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, DefaultAsyncHttpxClient] = (
    weakref.WeakKeyDictionary()
)


async def http_client() -> DefaultAsyncHttpxClient:
    """The ``openai`` SDK's async HTTP client shared by the rollouts on this loop (made, and
    ``openai`` imported, in a worker thread)."""
    loop = asyncio.get_running_loop()
    client = _HTTP.get(loop)
    if client is None:

        def make() -> DefaultAsyncHttpxClient:
            import openai

            http = openai.DefaultAsyncHttpxClient()
            # The SDK imports its resource and response-type modules on first use; do it
            # here so the first rollout's turn does not stall the loop on imports.
            _ = openai.AsyncOpenAI(api_key="-", base_url="http://127.0.0.1:9/v1",
                                   http_client=http).chat.completions
            import openai.types.chat

            # ...and warms the ABC caches its first request build walks (~0.25 s cold).
            http.build_request("POST", "http://127.0.0.1:9/v1/x", headers={"a": "b"}, json={})

            return http

        client = await asyncio.to_thread(make)
        client = _HTTP.setdefault(loop, client)
    return client


async def close_http_client() -> None:
    """Close this loop's shared HTTP client, if any."""
    client = _HTTP.pop(asyncio.get_running_loop(), None)
    if client is not None:
        await client.aclose()


class EnvironmentInfo(Protocol):
    """What a rollout keeps of its environment (an :class:`~tracewire.env.Environment`)."""

    name: str
    sampling: dict[str, Any]
    description: str


class Rollout:
    """One rollout in progress: its task, episode, trace, proxy session and sampling.

    ``state`` is a scratch dict shared by the setup hook, the harness, finalize and nothing
    else; ``stop(reason)`` names how the agent phase ended (first call wins).
    """

    def __init__(
        self,
        *,
        env: EnvironmentInfo,
        task: Task,
        episode: Episode,
        trace: Trace,
        session: SessionLike,
        model: str,
        sampling: dict[str, Any],
    ) -> None:
        self.env = env
        self.task = task
        self.episode = episode
        self.trace = trace
        self.session = session
        self.model = model
        self.sampling = sampling
        self.state: dict[str, Any] = {}
        self.workdir: Path | None = None
        #: Where a command harness runs its program (None: a host subprocess, or no program).
        self.runtime: RuntimeLike | None = None
        self.stop_reason: str | None = None
        self._client: AsyncOpenAI | None = None
        #: Shared HTTP client for the SDK (set during boot by the rollout runner).
        self.http: DefaultAsyncHttpxClient | None = None

    def stop(self, reason: str) -> None:
        """Record why the agent stopped (only the first reason is kept)."""
        if self.stop_reason is None:
            self.stop_reason = reason

    def client(self) -> AsyncOpenAI:
        """An ``openai.AsyncOpenAI`` client bound to this rollout's proxy session."""
        if self._client is None:
            from openai import AsyncOpenAI

            # No SDK retries: a failed turn is recorded by the proxy and ends the rollout,
            # instead of being silently re-sampled.
            self._client = AsyncOpenAI(
                base_url=self.session.base_url,
                api_key=self.session.secret,
                max_retries=0,
                timeout=None,
                http_client=self.http,
            )
        return self._client

    async def aclose(self) -> None:
        """Drop the SDK client (closing it only when it owns its HTTP client)."""
        if self._client is not None:
            client, self._client = self._client, None
            if self.http is None:
                await client.close()


def assistant_texts(trace: Trace) -> list[str]:
    """Text of every sampled (assistant) message on the trace's last branch, in order."""
    if not trace.nodes:
        return []
    out: list[str] = []
    for i in trace.path(len(trace.nodes) - 1):
        node = trace.nodes[i]
        if node.sampled and node.message.role == "assistant":
            content = node.message.content
            if isinstance(content, list):
                content = "".join(str(p.get("text", "")) for p in content)
            out.append(content or "")
    return out


def final_text(trace: Trace) -> str:
    """Text of the last assistant message (``""`` if the model never answered)."""
    texts = assistant_texts(trace)
    return texts[-1] if texts else ""
