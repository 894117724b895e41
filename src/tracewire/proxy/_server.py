"""The interception proxy: aiohttp app, session auth, upstream calls, turn commits."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

import aiohttp
import orjson
from aiohttp import web

from .._errors import ProxyError, SessionError
from .._memory import tune_allocator
from ..trace import Call, Span, Trace
from ._anthropic import AnthropicAdapter, count_tokens_request
from ._config import ProxyConfig
from ._dialect import Adapter, ChatAdapter, UpReq
from ._graph import Outcome, Prepared, RequestCache
from ._http import BadRequest, error_response
from ._prompt import PromptIds, parse_full, parse_tail
from ._rawjson import RawSpan
from ._responses import ResponsesAdapter
from ._session import Session, SessionRegistry
from ._stream import relay_stream
from ._upstream import cut_ok, cut_prompt, outcome_of

__all__ = ["Proxy"]

log = logging.getLogger("tracewire.proxy")
T = TypeVar("T")


class Proxy:
    """Interception proxy: harness requests in (OpenAI chat/Responses, Anthropic messages),
    one upstream OpenAI-compatible server out, every turn committed token-exact into the
    session's trace."""

    def __init__(
        self,
        upstream: str,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        config: ProxyConfig | None = None,
        session_api: bool = True,
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.host = host
        self.port = port
        self.config = config or ProxyConfig()
        self.session_api = session_api
        self.registry = SessionRegistry(self.config.max_sessions)
        self.app = web.Application(client_max_size=self.config.max_body_bytes)
        self._runner: web.AppRunner | None = None
        self._client: aiohttp.ClientSession | None = None
        self._upstream_headers = {"Content-Type": "application/json"}
        if self.config.upstream_api_key:
            self._upstream_headers["Authorization"] = f"Bearer {self.config.upstream_api_key}"
        self._sweeper: asyncio.Task[None] | None = None
        self._url = ""
        tf = self.config.token_fields
        self._adapters: dict[str, Adapter] = {
            "chat": ChatAdapter(tf), "responses": ResponsesAdapter(tf),
            "messages": AnthropicAdapter(tf),
        }
        for prefix in ("/v1", "/sessions/{sid}/v1"):
            r = self.app.router
            r.add_post(prefix + "/chat/completions", self._handler("chat"))
            r.add_post(prefix + "/responses", self._handler("responses"))
            r.add_post(prefix + "/messages", self._handler("messages"))
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
            try:
                from ..samples import add_session_routes
            except ImportError:
                pass  # the samples part is not installed in this build
            else:
                add_session_routes(self.app, self)
        self.app.router.add_route("*", "/{tail:.*}", self._unknown)
        self._client = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self.config.upstream_connections),
            timeout=aiohttp.ClientTimeout(total=self.config.upstream_timeout),
            auto_decompress=True,
        )
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
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def __aenter__(self) -> Proxy:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _sweep(self) -> None:
        period = max(1.0, min(30.0, self.config.session_ttl_s / 4))
        while True:
            await asyncio.sleep(period)
            self.registry.sweep()

    # -- sessions --------------------------------------------------------------------------
    def create_session(
        self,
        *,
        trace: Trace | None = None,
        metadata: dict[str, Any] | None = None,
        ttl: float | None = None,
        group_id: str | None = None,
        group_index: int = 0,
        max_turns: int | None = None,
        max_tokens: int | None = None,
    ) -> Session:
        """Create a session (``LimitError`` when ``max_sessions`` are live)."""
        cfg = self.config
        s = Session(
            proxy_url=self._url or f"http://{self.host}:{self.port}", trace=trace,
            metadata=metadata, ttl=cfg.session_ttl_s if ttl is None else ttl,
            group_id=group_id, group_index=group_index,
            max_turns=cfg.max_turns if max_turns is None else max_turns,
            max_tokens=cfg.max_tokens if max_tokens is None else max_tokens,
        )
        return self.registry.add(s)

    def _auth(self, request: web.Request) -> Session:
        auth = request.headers.get("Authorization", "")
        secret = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        secret = secret or request.headers.get("x-api-key", "")
        if not secret.isascii():  # secrets are ASCII; others cannot match (nor encode)
            secret = ""
        sid = request.match_info.get("sid")
        if sid is not None:
            try:
                s = self.registry.get(sid)
            except SessionError as exc:
                raise BadRequest(404, str(exc)) from exc
            if not secret or not hmac.compare_digest(secret.encode(), s.secret.encode()):
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
        if request.content_length is not None and request.content_length > limit:
            raise BadRequest(413, f"request body over {limit} bytes")
        # Plain string work: aiohttp's content_type property runs a full MIME parser.
        ctype = request.headers.get("Content-Type", "").partition(";")[0].strip().lower()
        if ctype not in ("application/json", "application/octet-stream", "") and not (
            ctype.endswith("+json")
        ):
            raise BadRequest(415, f"content type must be application/json, not {ctype}")
        try:
            return await request.read()
        except web.HTTPRequestEntityTooLarge as exc:
            raise BadRequest(413, f"request body over {limit} bytes") from exc
        except web.RequestPayloadError as exc:  # e.g. Content-Encoding: gzip, body is not
            request.content.feed_eof()  # nothing more to drain; the connection closes
            why = getattr(exc.__cause__, "message", "") or str(exc)
            raise BadRequest(400, f"unreadable request body: {why}", close=True) from exc

    async def _offload(self, size: int, fn: Callable[..., T], *args: Any) -> T:
        # Big bodies are parsed and hashed off the event loop.
        if size > self.config.thread_threshold_bytes:
            return await asyncio.to_thread(fn, *args)
        return fn(*args)

    # -- routes ----------------------------------------------------------------------------
    def _handler(self, endpoint: str) -> Callable[[web.Request], Any]:
        adapter = self._adapters[endpoint]

        async def handle(request: web.Request) -> web.StreamResponse:
            try:
                return await self._turn(request, adapter)
            except BadRequest as e:
                return e.response(adapter.dialect)

        return handle

    async def _unknown(self, request: web.Request) -> web.Response:
        dialect = "anthropic" if "anthropic-version" in request.headers else "openai"
        return error_response(dialect, 404, f"no route {request.method} {request.path}")

    async def _models(self, request: web.Request) -> web.Response:
        try:
            self._auth(request)
        except BadRequest as e:
            return error_response("openai", e.status, e.message)
        assert self._client is not None
        try:
            async with self._client.get(self.upstream + "/models",
                                        headers=self._upstream_headers) as r:
                data = await r.read()
                status = r.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            return error_response("openai", 502, f"upstream unreachable: {exc}")
        if status >= 400:
            return error_response("openai", 502, _upstream_message(data, status))
        return web.Response(body=data, content_type="application/json")

    async def _count_tokens(self, request: web.Request) -> web.Response:
        try:
            self._auth(request)
            body = await self._body(request)
            up = await self._offload(len(body), self._adapters["messages"].parse, body)
        except BadRequest as e:
            return e.response("anthropic")
        assert self._client is not None
        try:
            n = await count_tokens_request(self._client, self.upstream, up, self._upstream_headers)
        except ProxyError as exc:
            return error_response("anthropic", 502, str(exc))
        return web.Response(body=orjson.dumps({"input_tokens": n}),
                            content_type="application/json")

    # -- one turn --------------------------------------------------------------------------
    def _match(self, session: Session, up: UpReq) -> Prepared:
        g = session.graph
        parent, k = g.match_fast(up.hashes, up.base) if up.hashes is not None else (None, 0)
        try:
            rest = up.new_messages(k)
        except (ValueError, TypeError) as exc:
            raise BadRequest(400, f"bad message: {exc}") from exc
        parent, new = g.match_rest(parent, rest)
        return Prepared(parent, new)

    def _limit(self, session: Session) -> str | None:
        if session.max_turns is not None and session.turns >= session.max_turns:
            return "max_turns"
        if session.max_tokens is not None and session.last_total_tokens >= session.max_tokens:
            return "max_tokens"
        return None

    async def _turn(self, request: web.Request, adapter: Adapter) -> web.StreamResponse:
        session = self._auth(request)
        body = await self._body(request)
        up: UpReq | None = None
        # A harness resends its history: when the messages extend the last committed
        # request byte for byte, only the new ones are parsed and hashed.
        sp = adapter.splice(body, session.graph.request_cache)
        if sp is not None:
            up = await self._offload(len(sp.rest), adapter.parse_spliced, sp)
        if up is None:
            up = await self._offload(len(body), adapter.parse, body, session.tool_args)
        hooks: list[str] = []
        if self.config.request_hooks:
            d = up.as_dict()
            for hook in self.config.request_hooks:
                r = hook(session, adapter.endpoint, d)
                if r is not None:
                    d = r
                hooks.append(getattr(hook, "__name__", repr(hook)))
            up.forget_raw(d)
        stop = self._limit(session)
        if stop is not None:
            session.trace.stop = stop
            session.trace.notify()
            raise BadRequest(400, f"session limit reached: {stop}", stop)
        # SDK retries of a committed request get the committed answer back.
        idem = request.headers.get("Idempotency-Key")
        rkey = "b:" + hashlib.blake2b(
            adapter.endpoint.encode() + up.retry_material, digest_size=16).hexdigest()
        ikey = f"i:{adapter.endpoint}:{idem}" if idem else None
        try:
            retry = int(request.headers.get("x-stainless-retry-count", "0") or 0)
        except ValueError:
            retry = 0
        cached = session.recall(ikey) if ikey else (session.recall(rkey) if retry > 0 else None)
        if cached is not None:
            return await _replay(request, cached)
        size = sum(len(r) for r in up.raws) if up.raws is not None else len(body)
        prep = await self._offload(size, self._match, session, up)
        session.trace.set_pending([nm.message for nm in prep.new])
        call = Call(model=up.model, endpoint=adapter.endpoint, sampling=up.sampling,
                    span=Span(start=time.time()), hooks=tuple(hooks))
        payload = up.upstream_bytes(self.config.token_fields)

        def commit(out: Outcome) -> None:
            assert call.span is not None
            if call.span.end is None:
                call.span.end = time.time()
            nodes = session.graph.commit(prep, out, call, up.all_messages)
            for ch in out.choices:  # H6 stand-in for H1's Session.tool_args fill
                session.tool_args.update((tc.id, tc.arguments) for tc in ch.tool_calls if tc.id)
            span = up.msgs_span
            if nodes and span is not None and up.hasher is not None:
                last = session.trace.nodes[nodes[0]].parent
                if last is not None:
                    session.graph.request_cache = RequestCache(
                        span, span.content_end(), last, up.hasher)
            session.turns += 1
            total = out.usage.get("total_tokens")
            if total is None and out.prompt is not None:
                total = len(out.prompt) + max(
                    (len(c.token_ids or ()) for c in out.choices), default=0)
            session.last_total_tokens = int(total or 0)

        def remember(answer: tuple[int, str, bytes | list[bytes]]) -> None:
            session.remember(rkey, answer)
            if ikey:
                session.remember(ikey, answer)

        if up.stream:
            return await relay_stream(
                self, request, adapter, up, payload, call, session, commit, remember)
        return await self._unary(request, adapter, up, payload, call, session, commit, remember)

    async def _outcome(self, session: Session, data: bytes, call: Call
                       ) -> tuple[dict[str, Any], Outcome, bool]:
        """Parse a non-streamed upstream answer: (its dict, the outcome, whether a hook
        replaced the dict). Without response hooks the prompt ids array is cut out of the
        body unparsed (see ``_rawjson``/``_prompt``)."""
        hooks = self.config.response_hooks
        d: Any = None
        span: RawSpan | None = None
        size = len(data)
        if not hooks:
            cut = cut_prompt(data)
            if cut is not None:
                rest, cspan, name = cut
                try:
                    d = await self._offload(len(rest), orjson.loads, rest)
                except orjson.JSONDecodeError:
                    d = None
                if cut_ok(d, name):
                    span, size = cspan, len(rest)
                else:
                    d = None
        if d is None:
            d = await self._offload(len(data), orjson.loads, data)
        if not isinstance(d, dict) or not isinstance(d.get("choices"), list):
            raise ValueError("no choices")
        rewritten = False
        for hook in hooks:
            res = hook(session, call.endpoint, d)
            if res is not None:
                d, rewritten = res, True
            call.hooks = (*call.hooks, getattr(hook, "__name__", repr(hook)))
        out = await self._offload(size, outcome_of, d, span is not None)
        if span is not None:
            out.span = span
            out.prompt = await read_prompt(self, session, span)
        return d, out, rewritten

    async def _unary(
        self, request: web.Request, adapter: Adapter, up: UpReq, payload: bytes, call: Call,
        session: Session, commit: Callable[[Outcome], None],
        remember: Callable[[tuple[int, str, bytes | list[bytes]]], None],
    ) -> web.StreamResponse:
        assert self._client is not None
        try:
            async with self._client.post(self.upstream + "/chat/completions", data=payload,
                                         headers=self._upstream_headers) as r:
                data = await r.read()
                status = r.status
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            msg = f"upstream failed: {exc or type(exc).__name__}"
            session.graph.fail(call, msg)
            return error_response(adapter.dialect, 502, msg)
        if status >= 400:
            msg = _upstream_message(data, status)
            session.graph.fail(call, msg)
            return error_response(adapter.dialect, status if status < 500 else 502, msg)
        try:
            d, out, rewritten = await self._outcome(session, data, call)
        except (ValueError, TypeError, AttributeError) as exc:
            msg = f"upstream answered something unusable: {exc}"
            session.graph.fail(call, msg)
            return error_response(adapter.dialect, 502, msg)
        if request.transport is None or request.transport.is_closing():
            session.graph.fail(call, "harness disconnected before the answer")
            return web.Response(status=499)
        assert call.span is not None
        call.span.end = time.time()
        body = adapter.reply(up, d, out, None if rewritten else data)
        remember((200, "application/json", body))
        # The answer is complete and validated; recording it is not the harness's wait.
        # aiohttp writes the response right after this returns, and a callback queued now
        # runs on the next loop pass, before any request that reaches us after the answer
        # (asyncio runs queued callbacks before those of newly polled I/O).
        asyncio.get_running_loop().call_soon(_commit_soon, commit, out, session, call)
        return web.Response(body=body, content_type="application/json")


def _commit_soon(commit: Callable[[Outcome], None], out: Outcome, session: Session,
                 call: Call) -> None:
    try:
        commit(out)
    except Exception as exc:  # a bug: keep serving, and say so on the trace
        log.exception("recording a turn failed")
        session.graph.fail(call, f"recording the turn failed: {exc!r}")


async def read_prompt(proxy: Proxy, session: Session, span: RawSpan) -> PromptIds | None:
    """The prompt ids at ``span``: only the tail past the cached prompt is parsed when it
    extends it; otherwise the whole array, in a thread when big."""
    prompt = parse_tail(span, session.graph.prompt_cache)
    if prompt is None:
        prompt = await proxy._offload(span.end - span.start, parse_full, span)
    return prompt


def _upstream_message(data: bytes, status: int) -> str:
    """The upstream's own error message when it gave one."""
    try:
        d = orjson.loads(data)
    except orjson.JSONDecodeError:
        text = data[:2000].decode("utf-8", "replace").strip()
        return f"upstream error {status}: {text}"
    if isinstance(d, dict):
        err = d.get("error", d)
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return str(err["message"])
        if isinstance(err, str):
            return err
        if isinstance(d.get("message"), str):
            return str(d["message"])
    return f"upstream error {status}"


async def _replay(request: web.Request, cached: tuple[int, str, bytes | list[bytes]]
                  ) -> web.StreamResponse:
    status, ctype, body = cached
    if isinstance(body, bytes):
        return web.Response(status=status, body=body, content_type=ctype)
    resp = web.StreamResponse(status=status, headers={"Content-Type": ctype,
                                                      "Cache-Control": "no-cache"})
    await resp.prepare(request)
    for part in body:
        await resp.write(part)
    await resp.write_eof()
    return resp

