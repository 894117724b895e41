"""Trainer-side client of the session API: create, collect (decoded samples), delete.

Every request has a finite timeout. :meth:`SessionClient.collect` retries a lost collect
(collect is idempotent on the server), then always attempts ``DELETE`` and never lets a
failed delete hide the collect result.
"""

from __future__ import annotations

import asyncio
import logging
import warnings
from dataclasses import dataclass
from typing import Any, Literal, overload

import aiohttp
import msgspec
import orjson

from .._errors import ProxyError
from .._wire_errors import error_from_body
from ..samples import Sample, decode_samples, to_torch
from ._spec import TOKEN_ENV, SessionSpec, token_from_env

__all__ = ["SessionClient", "SessionInfo", "SyncSessionClient"]

log = logging.getLogger("tracewire.sessions")

Tensors = Literal["numpy", "torch"]


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """What ``POST /sessions`` answers: the session's ``id``, where the harness points its
    SDK, and the ``secret`` it sends as its API key (the same names as ``proxy.Session``;
    the JSON answer keeps its ``session_id`` and ``api_key`` keys)."""

    id: str
    base_url: str
    secret: str
    anthropic_base_url: str = ""
    group_id: str | None = None
    group_index: int = 0
    ttl: float | None = None

    @property
    def session_id(self) -> str:
        """Deprecated name of :attr:`id` (kept for one release)."""
        warnings.warn("SessionInfo.session_id is now SessionInfo.id; the old name goes in "
                      "the next release", DeprecationWarning, stacklevel=2)
        return self.id

    @property
    def api_key(self) -> str:
        """Deprecated name of :attr:`secret` (kept for one release)."""
        warnings.warn("SessionInfo.api_key is now SessionInfo.secret; the old name goes in "
                      "the next release", DeprecationWarning, stacklevel=2)
        return self.secret


def _raise_for(status: int, body: bytes) -> None:
    # The server sends the error's class, message and reason; rebuild that error here.
    try:
        d = orjson.loads(body)
    except orjson.JSONDecodeError:
        d = None
    if isinstance(d, dict) and isinstance(d.get("type"), str):
        raise error_from_body(d, default=ProxyError)
    text = body[:200].decode("utf-8", "replace") or f"HTTP {status}"
    raise ProxyError(f"session API answered {status}: {text}")


class SessionClient:
    """Async client of a proxy's session API (``base`` is the proxy URL, e.g.
    ``http://127.0.0.1:8000``). ``token`` is the proxy's trainer token (default: the
    ``TRACEWIRE_SESSION_TOKEN`` environment variable)."""

    def __init__(self, base: str, *, token: str | None = None, timeout: float = 120.0,
                 retries: int = 2) -> None:
        if not timeout or timeout <= 0:
            raise ValueError("timeout must be a positive number of seconds")
        self.base = base.rstrip("/")
        self.token = token if token is not None else token_from_env()
        self.timeout = timeout
        self.retries = retries
        self._http: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> SessionClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the HTTP connection pool."""
        if self._http is not None:
            await self._http.close()
            self._http = None

    def _client(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
        return self._http

    async def _request(self, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
        if body is None:
            data = None
        elif isinstance(body, bytes):
            data = body
        else:
            data = orjson.dumps(body)
        headers = {"Content-Type": "application/json"} if data is not None else {}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        elif path == "/sessions":
            log.warning("no session token: pass token= or set %s", TOKEN_ENV)
        try:
            async with self._client().request(
                method, self.base + path, data=data, headers=headers
            ) as r:
                return r.status, await r.read()
        except TimeoutError as exc:
            raise ProxyError(f"{method} {path} timed out after {self.timeout} s") from exc
        except aiohttp.ClientError as exc:
            raise ProxyError(f"{method} {path} failed: {exc}") from exc

    async def create(
        self,
        *,
        metadata: dict[str, Any] | None = None,
        ttl: float | None = None,
        group_id: str | None = None,
        group_index: int = 0,
        max_turns: int | None = None,
        max_tokens: int | None = None,
    ) -> SessionInfo:
        """Create a session; point the harness's SDK at ``base_url`` with ``secret`` as its
        API key."""
        spec = SessionSpec(metadata=metadata or {}, ttl=ttl, group_id=group_id,
                           group_index=group_index, max_turns=max_turns, max_tokens=max_tokens)
        status, data = await self._request("POST", "/sessions", msgspec.json.encode(spec))
        if status >= 300:
            _raise_for(status, data)
        d = orjson.loads(data)
        return SessionInfo(
            id=d["session_id"],
            base_url=d["base_url"],
            secret=d["api_key"],
            anthropic_base_url=d.get("anthropic_base_url", ""),
            group_id=d.get("group_id"),
            group_index=int(d.get("group_index") or 0),
            ttl=d.get("ttl"),
        )

    async def get(self, session_id: str) -> dict[str, Any]:
        """The session's summary (turns, tokens, branches, status, ...)."""
        status, data = await self._request("GET", f"/sessions/{session_id}")
        if status >= 300:
            _raise_for(status, data)
        out: dict[str, Any] = orjson.loads(data)
        return out

    async def payload(
        self,
        session_id: str,
        *,
        max_seq_len: int | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> bytes:
        """The raw safetensors payload, retrying a lost connection (collect is idempotent)."""
        body = {"max_seq_len": max_seq_len, "metadata": metadata or {}}
        for attempt in range(self.retries + 1):
            try:
                status, data = await self._request("POST", f"/sessions/{session_id}/samples", body)
            except ProxyError:
                if attempt == self.retries:
                    raise
                await asyncio.sleep(0.2 * 2**attempt)
                continue
            if status >= 300:
                _raise_for(status, data)
            return data
        raise AssertionError("unreachable")

    @overload
    async def samples(
        self,
        session_id: str,
        *,
        max_seq_len: int | None = ...,
        metadata: dict[str, Any] | None = ...,
        tensors: Literal["numpy"] = ...,
    ) -> list[Sample]: ...

    @overload
    async def samples(
        self,
        session_id: str,
        *,
        max_seq_len: int | None = ...,
        metadata: dict[str, Any] | None = ...,
        tensors: Literal["torch"],
    ) -> list[dict[str, Any]]: ...

    async def samples(
        self,
        session_id: str,
        *,
        max_seq_len: int | None = None,
        metadata: dict[str, Any] | None = None,
        tensors: Tensors = "numpy",
    ) -> list[Sample] | list[dict[str, Any]]:
        """Collect and decode the session's samples (the session stays open)."""
        data = await self.payload(session_id, max_seq_len=max_seq_len, metadata=metadata)
        samples = await asyncio.to_thread(decode_samples, data)
        return to_torch(samples) if tensors == "torch" else samples

    async def delete(self, session_id: str) -> None:
        """Delete the session (deleting an already deleted one is fine)."""
        status, data = await self._request("DELETE", f"/sessions/{session_id}")
        if status >= 300:
            _raise_for(status, data)

    @overload
    async def collect(
        self,
        session_id: str,
        *,
        max_seq_len: int | None = ...,
        metadata: dict[str, Any] | None = ...,
        tensors: Literal["numpy"] = ...,
    ) -> list[Sample]: ...

    @overload
    async def collect(
        self,
        session_id: str,
        *,
        max_seq_len: int | None = ...,
        metadata: dict[str, Any] | None = ...,
        tensors: Literal["torch"],
    ) -> list[dict[str, Any]]: ...

    async def collect(
        self,
        session_id: str,
        *,
        max_seq_len: int | None = None,
        metadata: dict[str, Any] | None = None,
        tensors: Tensors = "numpy",
    ) -> list[Sample] | list[dict[str, Any]]:
        """Collect the samples, then always attempt DELETE; a failing delete is logged,
        never raised over the collect's result (or its error)."""
        try:
            data = await self.payload(session_id, max_seq_len=max_seq_len, metadata=metadata)
        finally:
            try:
                await self.delete(session_id)
            except Exception as exc:
                log.warning("DELETE of session %s after collect failed: %s", session_id, exc)
        samples = await asyncio.to_thread(decode_samples, data)
        return to_torch(samples) if tensors == "torch" else samples


class SyncSessionClient:
    """Blocking wrapper of :class:`SessionClient` for synchronous trainer code (runs its
    own event loop; do not use from inside a running loop)."""

    def __init__(self, base: str, *, token: str | None = None, timeout: float = 120.0,
                 retries: int = 2) -> None:
        self._loop = asyncio.new_event_loop()
        self._client = SessionClient(base, token=token, timeout=timeout, retries=retries)

    def _run(self, coro: Any) -> Any:
        return self._loop.run_until_complete(coro)

    def create(self, **kwargs: Any) -> SessionInfo:
        """See :meth:`SessionClient.create`."""
        out: SessionInfo = self._run(self._client.create(**kwargs))
        return out

    def get(self, session_id: str) -> dict[str, Any]:
        """See :meth:`SessionClient.get`."""
        out: dict[str, Any] = self._run(self._client.get(session_id))
        return out

    def samples(self, session_id: str, **kwargs: Any) -> Any:
        """See :meth:`SessionClient.samples`."""
        return self._run(self._client.samples(session_id, **kwargs))

    def collect(self, session_id: str, **kwargs: Any) -> Any:
        """See :meth:`SessionClient.collect`."""
        return self._run(self._client.collect(session_id, **kwargs))

    def delete(self, session_id: str) -> None:
        """See :meth:`SessionClient.delete`."""
        self._run(self._client.delete(session_id))

    def close(self) -> None:
        """Close connections and the private loop."""
        if not self._loop.is_closed():
            self._run(self._client.close())
            self._loop.close()

    def __enter__(self) -> SyncSessionClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
