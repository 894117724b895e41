"""The HTTP session API, mounted on the proxy's aiohttp app (same process, same sessions).

``POST /sessions`` (a :class:`~tracewire.sessions.SessionSpec` as JSON) →
``{session_id, base_url, anthropic_base_url, api_key, ...}``; ``GET /sessions/{id}`` →
summary; ``POST /sessions/{id}/samples`` → the safetensors payload; ``DELETE
/sessions/{id}``. Every route needs the proxy's trainer token as ``Authorization: Bearer``
(a session's harness secret is not it); POST bodies must be ``application/json``.

Errors are JSON ``{"error": message, "type": class, "message": message, "reason": ...}``
(``type``/``reason`` let the client rebuild the same error, see ``tracewire._wire_errors``):
400 malformed request (every malformed body: integers past int32, ids over 1,024
characters, metadata deeper than 32 levels or over 100,000 values), 401 missing or wrong
token, 404 unknown session (``reason`` never_existed / expired / deleted), 413 body or
payload over its cap, 415 not JSON, 422 assembly or hook failure, 429 too many sessions,
500 anything else (logged; the server keeps serving).

Collect is idempotent: the same request repeated while the trace is unchanged, or after the
session was deleted or expired (within ``grace_s``), answers the same payload.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
from aiohttp import web

from .._errors import HookError, LimitError, ProxyError, SampleError, SessionError, TracewireError
from .._wire_errors import error_body
from ..samples import (
    Picker,
    Postprocess,
    SampleBuilder,
    default_picker,
    default_postprocess,
    encode_parts,
)
from ..sessions import GoneReason, SessionSpec, SessionStatus, decode_spec
from ..trace import InfoKey
from ._session import Session, SessionRegistry


class SessionHost(Protocol):
    """What the session API needs of the proxy it is mounted on (a protocol, so this
    module does not import the app that mounts it)."""

    registry: SessionRegistry
    session_token: str

    def create_session(self, spec: SessionSpec | None = None) -> Session:
        """A new session from ``spec``."""
        ...

    async def finish_session(self, session_id: str) -> None:
        """Record what the upstream reports about the session in its trace's ``info``."""
        ...

__all__ = ["SessionAPI", "add_session_routes"]

log = logging.getLogger("tracewire.proxy.sessions")

SESSION_API_KEY: web.AppKey[SessionAPI] = web.AppKey("tracewire_session_api")
_CHUNK = 1 << 20
_BYTES_PER_TOKEN = 9  # int32 id + uint8 mask + float32 logprob
_SAMPLES_KEYS = frozenset({"max_seq_len", "metadata"})
#: Bounds on a session body: integers fit int32 (they end up in tensors and headers),
#: metadata nests at most this deep and holds at most this many values, ids stay short.
_MAX_INT = (1 << 31) - 1
_MAX_DEPTH = 32
_MAX_VALUES = 100_000
_MAX_ID = 1024
_JSON_INT = 1 << 63  # orjson writes no integer outside [-2**63, 2**64)
_INLINE_CHECK = 64 * 1024  # bodies up to this size are checked on the loop (< ~1 ms)


class _HTTPFail(Exception):
    """An answer with ``status`` describing ``error`` (rebuilt as its class by clients)."""

    def __init__(self, status: int, error: TracewireError | str) -> None:
        exc = ProxyError(error) if isinstance(error, str) else error
        super().__init__(str(exc))
        self.status = status
        self.error = exc


def _error(status: int, exc: TracewireError) -> web.Response:
    # "error" stays the message string that clients before the typed shape read.
    body = {"error": str(exc), **error_body(exc)}
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


def _json(obj: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(obj), content_type="application/json")


@dataclass(slots=True)
class _Collected:
    key: bytes
    version: tuple[int, ...]
    # The payload as buffers: views of the trace's append-only columns plus the few
    # arrays assembly made, so keeping it for repeats costs (almost) no extra memory.
    parts: list[bytes | memoryview]
    closed_at: float | None = None


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _guard(api: SessionAPI, fn: Handler) -> Handler:
    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            api.check_token(request)
            return await fn(request)
        except _HTTPFail as e:
            return _error(e.status, e.error)
        except (HookError, SampleError) as e:
            return _error(422, e)
        except LimitError as e:
            return _error(413, e)
        except Exception as e:
            log.exception("session API %s %s failed", request.method, request.path)
            return _error(500, ProxyError(f"internal error: {type(e).__name__}: {e}"))

    return wrapped


def _not_forwarded(session: Session) -> dict[str, Any]:
    """``tools_not_forwarded``: {tool name: calls that offered it} when a harness offered
    tools the upstream request could not carry (hosted tools on the Responses path)."""
    counts: dict[str, int] = {}
    for c in session.trace.calls:
        for f in c.flags:
            if f.startswith("tools_not_forwarded:"):
                name = f.partition(":")[2]
                counts[name] = counts.get(name, 0) + 1
    return {"tools_not_forwarded": counts} if counts else {}


def _opt_int(body: dict[str, Any], key: str, lo: int) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= _MAX_INT:
        raise _HTTPFail(400, f"{key!r} must be an integer in [{lo}, {_MAX_INT}] or null, "
                             f"got {str(v)[:40]}")
    return v


def _check_json_value(value: Any, what: str) -> None:
    """``_HTTPFail(400)`` unless ``value`` nests at most ``_MAX_DEPTH`` deep, holds at most
    ``_MAX_VALUES`` values and every integer is one JSON writers accept (iterative: a deep
    value must not exhaust the stack here either)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    seen = 0
    while stack:
        v, depth = stack.pop()
        seen += 1
        if seen > _MAX_VALUES:
            raise _HTTPFail(400, f"{what} holds more than {_MAX_VALUES} values")
        if isinstance(v, dict | list):
            if depth >= _MAX_DEPTH:
                raise _HTTPFail(400, f"{what} nests deeper than {_MAX_DEPTH} levels")
            stack.extend((x, depth + 1) for x in (v.values() if isinstance(v, dict) else v))
        elif isinstance(v, int) and not isinstance(v, bool) and not -_JSON_INT <= v < _JSON_INT:
            raise _HTTPFail(400, f"{what} holds an integer outside 64 bits: {str(v)[:40]}…")


def _check_spec(spec: SessionSpec) -> None:
    """Bounds ``SessionSpec`` does not state: integer ranges, id length, metadata shape."""
    for key in ("group_index", "max_turns", "max_tokens"):
        v = getattr(spec, key)
        if v is not None and v > _MAX_INT:
            raise _HTTPFail(400, f"{key!r} must be at most {_MAX_INT}, got {str(v)[:40]}")
    if spec.group_id is not None and len(spec.group_id) > _MAX_ID:
        raise _HTTPFail(400, f"'group_id' is over {_MAX_ID} characters")
    _check_json_value(spec.metadata, "'metadata'")


def _opt_dict(body: dict[str, Any], key: str) -> dict[str, Any]:
    v = body.get(key)
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise _HTTPFail(400, f"{key!r} must be a JSON object, got {type(v).__name__}")
    return v


class SessionAPI:
    """State of the session API on one proxy: a :class:`SampleBuilder` per session, the
    last collected payload per session, the hooks and the caps. Attributes may be changed
    before or while serving."""

    def __init__(
        self,
        proxy: SessionHost,
        *,
        picker: Picker | None = default_picker,
        postprocess: Postprocess | None = default_postprocess,
        max_request_bytes: int = 1 << 20,
        max_payload_bytes: int = 4 << 30,
        grace_s: float = 300.0,
        sweep_s: float = 30.0,
    ) -> None:
        self.proxy = proxy
        self.picker = picker
        self.postprocess = postprocess
        #: Largest JSON body accepted by the session routes (metadata, options).
        self.max_request_bytes = max_request_bytes
        #: Largest samples payload built for one collect; bigger answers 413.
        self.max_payload_bytes = max_payload_bytes
        #: How long a collected payload is still served after DELETE or expiry.
        self.grace_s = grace_s
        self.sweep_s = sweep_s
        self.builders: dict[str, SampleBuilder] = {}
        self.collected: dict[str, _Collected] = {}
        self._sweeper: asyncio.Task[None] | None = None

    # -- bookkeeping -----------------------------------------------------------------------
    def builder(self, session: Session) -> SampleBuilder:
        """The session's builder, created on first use (catching up on an existing trace
        happens in the collect's worker thread, not here on the loop)."""
        b = self.builders.get(session.id)
        if b is None or b.trace is not session.trace:
            if b is not None:
                b.close()
            b = SampleBuilder(session.trace).attach(catch_up=False)
            self.builders[session.id] = b
        return b

    def sweep(self, now: float | None = None) -> None:
        """Forget builders of sessions gone from the registry and payloads past grace."""
        now = time.time() if now is None else now
        registry = self.proxy.registry
        for sid in [sid for sid in self.builders if sid not in registry]:
            self.builders.pop(sid).close()
        for sid, c in list(self.collected.items()):
            if sid in registry:
                continue
            if c.closed_at is None:
                c.closed_at = now
            elif now - c.closed_at > self.grace_s:
                del self.collected[sid]

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.sweep_s)
            try:
                self.sweep()
            except Exception:
                log.exception("session API sweep failed")

    async def on_startup(self, _app: web.Application) -> None:
        """Start the periodic sweep."""
        self._sweeper = asyncio.create_task(self._sweep_forever())

    async def on_cleanup(self, _app: web.Application) -> None:
        """Stop the sweep and detach every builder."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None
        for b in self.builders.values():
            b.close()
        self.builders.clear()

    def check_token(self, request: web.Request) -> None:
        """``_HTTPFail(401)`` unless the request carries the proxy's trainer token."""
        auth = request.headers.get("Authorization", "")
        given = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        token = self.proxy.session_token
        if not given or not hmac.compare_digest(given.encode("utf-8", "replace"),
                                                token.encode()):
            if self._probe(request, given):
                # Agents probe their base URL (Claude Code HEADs /sessions/{id} before it
                # connects): the answer tells an agent nothing about where a token lives.
                raise _HTTPFail(401, "unauthorized")
            raise _HTTPFail(401, "missing or wrong session token (Authorization: Bearer "
                                 "<token>; the proxy's TRACEWIRE_SESSION_TOKEN)")

    def _probe(self, request: web.Request, bearer: str) -> bool:
        """Whether a refused request is an agent's read rather than a trainer's mistake: a
        HEAD, or a GET with no bearer token or an agent's own session secret."""
        if request.method == "HEAD":
            return True
        if request.method != "GET":
            return False
        if bearer:
            cred = bearer
        elif "Authorization" in request.headers:
            return False  # a malformed trainer header: it gets the hint
        else:
            cred = request.headers.get("x-api-key", "")
        return not cred or (cred.isascii() and self.proxy.registry.by_secret(cred) is not None)

    async def _read_body(self, request: web.Request) -> bytes:
        ctype = request.headers.get("Content-Type", "").partition(";")[0].strip().lower()
        if ctype != "application/json" and not ctype.endswith("+json"):
            raise _HTTPFail(415, f"content type must be application/json, not {ctype!r}")
        cap = self.max_request_bytes
        if request.content_length is not None and request.content_length > cap:
            raise _HTTPFail(413, LimitError(f"request body over {cap} bytes"))
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.content.iter_chunked(1 << 16):
            size += len(chunk)
            if size > cap:
                raise _HTTPFail(413, LimitError(f"request body over {cap} bytes"))
            chunks.append(chunk)
        return b"".join(chunks)

    async def _read_json(self, request: web.Request) -> dict[str, Any]:
        body = await self._read_body(request)
        if not body.strip():
            return {}
        try:
            obj = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise _HTTPFail(400, f"request body is not valid JSON: {exc}") from exc
        if not isinstance(obj, dict):
            raise _HTTPFail(400, "request body must be a JSON object")
        return obj

    # -- routes ----------------------------------------------------------------------------
    async def create(self, request: web.Request) -> web.StreamResponse:
        """``POST /sessions``."""
        body = await self._read_body(request)
        try:
            spec = decode_spec(body)
        except ValueError as exc:
            raise _HTTPFail(400, str(exc)) from exc
        except RecursionError as exc:
            raise _HTTPFail(400, "request body nests too deeply") from exc
        if len(body) > _INLINE_CHECK:
            await asyncio.to_thread(_check_spec, spec)
        else:
            _check_spec(spec)
        try:
            session = self.proxy.create_session(spec)
        except LimitError as exc:
            raise _HTTPFail(429, exc) from exc
        self.builder(session)
        return _json(
            {
                "session_id": session.id,
                "base_url": session.base_url,
                "anthropic_base_url": session.anthropic_base_url,
                "api_key": session.secret,
                "group_id": session.group_id,
                "group_index": session.group_index,
                "ttl": session.ttl,
            },
            status=201,
        )

    def _session(self, request: web.Request) -> Session:
        sid = request.match_info["sid"]
        try:
            return self.proxy.registry.get(sid)
        except SessionError as exc:
            raise _HTTPFail(404, exc) from exc

    async def summary(self, request: web.Request) -> web.StreamResponse:
        """``GET /sessions/{id}``."""
        session = self._session(request)
        counts = await asyncio.to_thread(self.builder(session).summary)
        await self.proxy.finish_session(session.id)  # tito_mismatch, when token-in/out
        tito = {k: session.trace.info[k] for k in (InfoKey.TITO_MISMATCH, InfoKey.TITO)
                if k in session.trace.info}
        return _json(
            {
                "session_id": session.id,
                "status": session.status,
                **counts,
                "token_mismatches": session.trace.info.get(InfoKey.TOKEN_MISMATCHES, 0),
                **_not_forwarded(session),
                "created": session.created,
                "last_used": session.last_used,
                "ttl": session.ttl,
                "metadata": session.metadata,
                "group_id": session.group_id,
                "group_index": session.group_index,
                "collected": session.id in self.collected,
                **tito,
            }
        )

    async def samples(self, request: web.Request) -> web.StreamResponse:
        """``POST /sessions/{id}/samples``."""
        sid = request.match_info["sid"]
        body = await self._read_json(request)
        unknown = set(body) - _SAMPLES_KEYS
        if unknown:
            raise _HTTPFail(
                400, f"unknown fields {sorted(unknown)}; allowed {sorted(_SAMPLES_KEYS)}"
            )
        max_seq_len = _opt_int(body, "max_seq_len", 1)
        overrides = _opt_dict(body, "metadata")
        _check_json_value(overrides, "'metadata'")
        key = orjson.dumps([max_seq_len, overrides], option=orjson.OPT_SORT_KEYS)
        cached = self.collected.get(sid)
        try:
            session = self.proxy.registry.get(sid)
        except SessionError as exc:
            if (
                cached is not None
                and cached.key == key
                and (cached.closed_at is None or time.time() - cached.closed_at <= self.grace_s)
            ):
                return await self._payload(request, cached.parts)
            raise _HTTPFail(404, exc) from exc
        session.touch()
        builder = self.builder(session)
        trace = session.trace
        # Same trace and same hooks → same answer; anything else is assembled afresh.
        version = (
            len(trace.nodes),
            len(trace.calls),
            len(trace.columns),
            id(self.picker),
            id(self.postprocess),
        )
        if cached is not None and cached.key == key and cached.version == version:
            return await self._payload(request, cached.parts)
        parts = await asyncio.to_thread(self._collect, session, builder, max_seq_len, overrides)
        self.collected[sid] = _Collected(key=key, version=version, parts=parts)
        return await self._payload(request, parts)

    def _collect(
        self,
        session: Session,
        builder: SampleBuilder,
        max_seq_len: int | None,
        overrides: dict[str, Any],
    ) -> list[bytes | memoryview]:
        # Runs in a worker thread: hooks, gathering and encoding never touch the loop.
        candidates = builder.candidates()
        samples = builder.samples(
            max_seq_len=max_seq_len,
            picker=self.picker,
            postprocess=self.postprocess,
            metadata=session.metadata,
            computed={"session_id": session.id},
            overrides=overrides,
            group_id=session.group_id,
            group_index=session.group_index,
        )
        size = sum(int(s.tokens.shape[0]) for s in samples) * _BYTES_PER_TOKEN
        if size > self.max_payload_bytes:
            raise LimitError(
                f"samples payload of ~{size} bytes is over max_payload_bytes="
                f"{self.max_payload_bytes}; pass a smaller max_seq_len"
            )
        kept = {s.leaf for s in samples}
        info = {
            "session_id": session.id,
            "group_id": session.group_id,
            "group_index": session.group_index,
            "trace_id": session.trace.id,
            "turns": builder.summary()["turns"],
            "token_mismatches": session.trace.info.get(InfoKey.TOKEN_MISMATCHES, 0),
            "max_seq_len": max_seq_len,
            "dropped_leaves": [leaf for leaf in candidates if leaf not in kept],
        }
        return encode_parts(samples, info=info)

    @staticmethod
    async def _payload(request: web.Request, parts: list[bytes | memoryview]) -> web.StreamResponse:
        # The buffers go to the socket as they are (no joined copy), in slices so a
        # multi-MB payload never sits in one loop-blocking write.
        resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        resp.content_length = sum(memoryview(p).nbytes for p in parts)
        await resp.prepare(request)
        for part in parts:
            view = memoryview(part).cast("B")
            for i in range(0, view.nbytes, _CHUNK):
                await resp.write(view[i : i + _CHUNK])
        await resp.write_eof()
        return resp

    async def delete(self, request: web.Request) -> web.StreamResponse:
        """``DELETE /sessions/{id}`` (repeating it is harmless: 200 with ``already``)."""
        sid = request.match_info["sid"]
        registry = self.proxy.registry
        try:
            registry.delete(sid)
            already = None
        except SessionError as exc:
            if exc.reason == GoneReason.NEVER_EXISTED:
                raise _HTTPFail(404, exc) from exc
            already = str(exc)
        b = self.builders.pop(sid, None)
        if b is not None:
            b.close()
        c = self.collected.get(sid)
        if c is not None and c.closed_at is None:
            c.closed_at = time.time()
        return _json({"session_id": sid, "status": SessionStatus.CLOSED, "already": already})


def add_session_routes(app: web.Application, proxy: SessionHost, **options: Any) -> SessionAPI:
    """Mount the session API on ``app`` (the proxy's) and return its :class:`SessionAPI`.

    ``options`` go to :class:`SessionAPI` (``picker``, ``postprocess``, caps, ``grace_s``).
    Calling it again on the same app returns the existing API unchanged, so a user can
    mount it with custom hooks before ``Proxy.start()`` mounts the defaults.
    """
    if SESSION_API_KEY in app:
        return app[SESSION_API_KEY]
    api = SessionAPI(proxy, **options)
    app[SESSION_API_KEY] = api
    r = app.router
    r.add_post("/sessions", _guard(api, api.create))
    r.add_get("/sessions/{sid}", _guard(api, api.summary))
    r.add_delete("/sessions/{sid}", _guard(api, api.delete))
    r.add_post("/sessions/{sid}/samples", _guard(api, api.samples))
    app.on_startup.append(api.on_startup)
    app.on_cleanup.append(api.on_cleanup)
    return api
