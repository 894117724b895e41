"""The interception proxy's app: lifecycle, routes and auth; each turn is handed whole to the
turn pipeline (``_turn``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web

from .._errors import ProxyError, SessionError, UpstreamError
from .._memory import tune_allocator
from ..sessions import SessionSpec, token_from_env
from ..trace import Endpoint, Trace
from ._adapter import Adapter
from ._anthropic import AnthropicAdapter
from ._config import ProxyConfig
from ._dialect import ChatAdapter
from ._http import (
    BadRequest,
    Dialect,
    bearer,
    check_length,
    content_type,
    error_response,
    read_body,
    secret_matches,
)
from ._responses import ResponsesAdapter
from ._session import Session, SessionRegistry
from ._session_api import SESSION_API_KEY, add_session_routes
from ._turn import TurnPipeline
from ._upstream_api import Upstream
from ._upstream_http import HttpUpstream

__all__ = ["Proxy"]

log = logging.getLogger("tracewire.proxy")


class Proxy:
    """Interception proxy: harness requests in (OpenAI chat/Responses, Anthropic messages),
    one upstream out (an :class:`Upstream`, or the base URL of an OpenAI-compatible server),
    every turn committed token-exact into the session's trace."""

    def __init__(
        self,
        upstream: str | Upstream,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        config: ProxyConfig | None = None,
        session_api: bool = True,
    ) -> None:
        self.config = config or ProxyConfig()
        cfg = self.config
        if isinstance(upstream, str):
            upstream = HttpUpstream(
                upstream, api_key=cfg.upstream_api_key, timeout=cfg.upstream_timeout,
                connections=cfg.upstream_connections,
                thread_threshold_bytes=cfg.thread_threshold_bytes)
        #: Who answers the model calls.
        self.upstream: Upstream = upstream
        self.host = host
        self.port = port
        self.session_api = session_api
        #: The trainer credential of the session API (see ``ProxyConfig.session_token``);
        #: ``session_token_generated`` says it was made up here, not given.
        given = cfg.session_token or token_from_env()
        self.session_token_generated = given is None
        self.session_token: str = given or "tws-" + secrets.token_urlsafe(24)
        self.registry = SessionRegistry(self.config.max_sessions)
        self.app = web.Application(client_max_size=self.config.max_body_bytes)
        self._runner: web.AppRunner | None = None
        self._pipeline = TurnPipeline(self.config, upstream)
        self._sweeper: asyncio.Task[None] | None = None
        self._url = ""
        tf = self.config.token_fields
        self._adapters: dict[Endpoint, Adapter] = {
            Endpoint.CHAT: ChatAdapter(tf), Endpoint.RESPONSES: ResponsesAdapter(tf),
            Endpoint.MESSAGES: AnthropicAdapter(tf),
        }
        for prefix in ("/v1", "/sessions/{sid}/v1"):
            r = self.app.router
            r.add_post(prefix + "/chat/completions", self._handler(Endpoint.CHAT))
            r.add_post(prefix + "/responses", self._handler(Endpoint.RESPONSES))
            r.add_post(prefix + "/messages", self._handler(Endpoint.MESSAGES))
            r.add_post(prefix + "/messages/count_tokens", self._count_tokens)
            r.add_get(prefix + "/models", self._models)

    # -- lifecycle -------------------------------------------------------------------------
    @property
    def url(self) -> str:
        """``http://HOST:PORT`` once started."""
        if not self._url:
            raise ProxyError("proxy not started")
        return self._url

    async def start(self) -> None:
        """Bind and serve; adds the session API routes when ``session_api`` is true."""
        if self.config.tune_memory:
            tune_allocator()
        if self.session_api:
            add_session_routes(self.app, self)
        self.app.router.add_route("*", "/{tail:.*}", self._unknown)
        await self.upstream.start()
        self._runner = web.AppRunner(self.app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        server = site._server
        assert server is not None
        sock = server.sockets[0]  # type: ignore[attr-defined]
        self.port = int(sock.getsockname()[1])
        self._url = f"http://{self.host}:{self.port}"
        self._sweeper = asyncio.create_task(self._sweep())

    async def stop(self) -> None:
        """Stop serving and close upstream connections."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self.upstream.close()

    async def __aenter__(self) -> Proxy:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def sweep(self) -> None:
        """Drop expired sessions, then the session API's state of sessions that are gone
        (the proxy's one periodic sweep runs this; calling it by hand is harmless)."""
        self.registry.sweep()
        api = self.app.get(SESSION_API_KEY)
        if api is not None:
            api.sweep()

    async def _sweep(self) -> None:
        period = max(1.0, min(30.0, self.config.session_ttl_s / 4))
        while True:
            await asyncio.sleep(period)
            try:
                self.sweep()
            except Exception:  # a failed sweep must not end the sweeping
                log.exception("proxy sweep failed")

    # -- sessions --------------------------------------------------------------------------
    def create_session(
        self,
        spec: SessionSpec | None = None,
        *,
        trace: Trace | None = None,
        metadata: dict[str, Any] | None = None,
        ttl: float | None = None,
        group_id: str | None = None,
        group_index: int = 0,
        max_turns: int | None = None,
        max_tokens: int | None = None,
    ) -> Session:
        """Create a session from ``spec`` or the same fields as keywords (None: the
        config's default); ``LimitError`` when ``max_sessions`` are live."""
        if spec is None:
            spec = SessionSpec(metadata=metadata or {}, ttl=ttl, group_id=group_id,
                               group_index=group_index, max_turns=max_turns,
                               max_tokens=max_tokens)
        cfg = self.config
        s = Session(
            proxy_url=self._url or f"http://{self.host}:{self.port}", trace=trace,
            metadata=spec.metadata, ttl=cfg.session_ttl_s if spec.ttl is None else spec.ttl,
            group_id=spec.group_id, group_index=spec.group_index,
            max_turns=cfg.max_turns if spec.max_turns is None else spec.max_turns,
            max_tokens=cfg.max_tokens if spec.max_tokens is None else spec.max_tokens,
        )
        return self.registry.add(s)

    async def finish_session(self, session_id: str) -> None:
        """Record what the upstream reports about a finished session in its trace's
        ``info`` (token-in/token-out: ``tito_mismatch``); a no-op for pass-through.
        ``SessionError`` for an unknown id."""
        await self._pipeline.finish(self.registry.get(session_id))

    def _auth(self, request: web.Request) -> Session:
        secret = bearer(request) or request.headers.get("x-api-key", "")
        if not secret.isascii():  # secrets are ASCII; no other string can match
            secret = ""
        sid = request.match_info.get("sid")
        if sid is not None:
            try:
                s = self.registry.get(sid)
            except SessionError as exc:
                raise BadRequest(404, str(exc)) from exc
            if not secret_matches(secret, s.secret):
                raise BadRequest(401, "invalid or missing session secret")
        else:
            found = self.registry.by_secret(secret) if secret else None
            if found is None:
                raise BadRequest(401, "invalid or missing session secret")
            s = found
        s.touch()
        return s

    async def _body(self, request: web.Request) -> bytes:
        limit = self.config.max_body_bytes
        check_length(request, limit)  # a declared size over the cap is a 413 whatever its type
        ctype = content_type(request)
        if ctype not in ("application/json", "application/octet-stream", "") and not (
            ctype.endswith("+json")
        ):
            raise BadRequest(415, f"content type must be application/json, not {ctype}")
        return await read_body(request, limit)

    # -- routes ----------------------------------------------------------------------------
    def _handler(self, endpoint: Endpoint) -> Callable[[web.Request], Any]:
        adapter = self._adapters[endpoint]

        async def handle(request: web.Request) -> web.StreamResponse:
            try:
                session = self._auth(request)
            except BadRequest as e:
                return e.response(adapter.dialect)
            try:
                body = await self._body(request)
            except BadRequest as e:
                return self._pipeline.refuse(session, adapter, e)
            return await self._pipeline.run(request, adapter, session, body)

        return handle

    async def _unknown(self, request: web.Request) -> web.Response:
        dialect = Dialect.ANTHROPIC if "anthropic-version" in request.headers else Dialect.OPENAI
        return error_response(dialect, 404, f"no route {request.method} {request.path}")

    async def _models(self, request: web.Request) -> web.Response:
        try:
            self._auth(request)
        except BadRequest as e:
            return e.response(Dialect.OPENAI)
        try:
            data = await self.upstream.models()
        except UpstreamError as exc:
            return error_response(Dialect.OPENAI, 502, str(exc))
        return web.Response(body=data, content_type="application/json")

    async def _count_tokens(self, request: web.Request) -> web.Response:
        try:
            self._auth(request)
            body = await self._body(request)
            parse = self._adapters[Endpoint.MESSAGES].parse
            up = await self._pipeline.offload(len(body), parse, body)
        except BadRequest as e:
            return e.response(Dialect.ANTHROPIC)
        try:
            n = await self.upstream.count_tokens(up.as_dict())
        except UpstreamError as exc:
            return error_response(Dialect.ANTHROPIC, 502, str(exc))
        return web.Response(body=orjson.dumps({"input_tokens": n}),
                            content_type="application/json")
