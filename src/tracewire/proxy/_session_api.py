"""The HTTP session API, mounted on the proxy's aiohttp app (same process, same sessions).

``POST /sessions`` (a :class:`~tracewire.sessions.SessionSpec` as JSON) →
``{session_id, base_url, anthropic_base_url, api_key, ...}``; ``GET /sessions/{id}`` →
summary; ``POST /sessions/{id}/samples`` → the safetensors payload; ``DELETE
/sessions/{id}``. Every route needs the proxy's trainer token as ``Authorization: Bearer``
(a session's harness secret is not it); POST bodies must be ``application/json``.

Errors are JSON ``{"error": message, "type": class, "message": message, "reason": ...}``
(``type``/``reason`` let the client rebuild the same error, see ``tracewire._wire_errors``):
400 malformed request (every malformed or undecodable body: integers past int32, ids
over 1,024 characters, metadata deeper than 32 levels or over 100,000 values), 401 missing
or wrong token, 404 unknown session (``reason`` never_existed / expired / deleted), 413 body or
payload over its cap, 415 not JSON, 422 assembly or hook failure, 429 too many sessions,
500 anything else (logged; the server keeps serving).

Collect is idempotent: the same request repeated while the trace is unchanged, or after the
session was deleted or expired (within ``grace_s``), answers the same payload. This module
is the HTTP side only (parse, validate, answer); the sample state is ``_collector``'s.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import orjson
from aiohttp import web

from .._errors import HookError, LimitError, ProxyError, SampleError, SessionError, TracewireError
from .._wire_errors import error_body
from ..samples import Picker, Postprocess, default_picker, default_postprocess
from ..sessions import GoneReason, SessionSpec, SessionStatus, decode_spec
from ..trace import InfoKey
from ._collector import SampleCollector
from ._http import BadRequest, bearer, content_type, read_body, secret_matches, send_buffers
from ._session import Session, SessionRegistry
from ._validate import opt_int

__all__ = ["SESSION_API_KEY", "SessionAPI", "SessionHost", "add_session_routes"]


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


log = logging.getLogger("tracewire.proxy.sessions")

#: Where the mounted :class:`SessionAPI` is kept on its app.
SESSION_API_KEY: web.AppKey[SessionAPI] = web.AppKey("tracewire_session_api")
_SAMPLES_KEYS = frozenset({"max_seq_len", "metadata"})
#: Bounds on a session body: integers fit int32 (they end up in tensors and headers),
#: metadata nests at most this deep and holds at most this many values, ids stay short.
_MAX_INT = (1 << 31) - 1
_MAX_DEPTH = 32
_MAX_VALUES = 100_000
_MAX_ID = 1024
_JSON_INT = 1 << 63  # orjson writes no integer outside [-2**63, 2**64)
_INLINE_CHECK = 64 * 1024  # bodies up to this size are checked on the loop (< ~1 ms)


def _refuse(status: int, exc: TracewireError) -> BadRequest:
    """A ``status`` answer that a client rebuilds as ``exc``."""
    return BadRequest(status, str(exc), error=exc)


def _error(status: int, exc: TracewireError, *, close: bool = False) -> web.Response:
    # "error" stays the message string that clients before the typed shape read.
    body = {"error": str(exc), **error_body(exc)}
    resp = web.Response(status=status, body=orjson.dumps(body), content_type="application/json")
    if close:
        resp.force_close()
    return resp


def _json(obj: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(obj), content_type="application/json")


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _guard(api: SessionAPI, fn: Handler) -> Handler:
    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            api.check_token(request)
            return await fn(request)
        except BadRequest as e:
            return _error(e.status, e.error or ProxyError(e.message), close=e.close)
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


def _check_json_value(value: Any, what: str) -> None:
    """``BadRequest(400)`` unless ``value`` nests at most ``_MAX_DEPTH`` deep, holds at most
    ``_MAX_VALUES`` values and every integer is one JSON writers accept (iterative: a deep
    value must not exhaust the stack here either)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    seen = 0
    while stack:
        v, depth = stack.pop()
        seen += 1
        if seen > _MAX_VALUES:
            raise BadRequest(400, f"{what} holds more than {_MAX_VALUES} values")
        if isinstance(v, dict | list):
            if depth >= _MAX_DEPTH:
                raise BadRequest(400, f"{what} nests deeper than {_MAX_DEPTH} levels")
            stack.extend((x, depth + 1) for x in (v.values() if isinstance(v, dict) else v))
        elif isinstance(v, int) and not isinstance(v, bool) and not -_JSON_INT <= v < _JSON_INT:
            raise BadRequest(400, f"{what} holds an integer outside 64 bits: {str(v)[:40]}…")


def _check_spec(spec: SessionSpec) -> None:
    """Bounds ``SessionSpec`` does not state: integer ranges, id length, metadata shape."""
    for key in ("group_index", "max_turns", "max_tokens"):
        v = getattr(spec, key)
        if v is not None and v > _MAX_INT:
            raise BadRequest(400, f"{key!r} must be at most {_MAX_INT}, got {str(v)[:40]}")
    if spec.group_id is not None and len(spec.group_id) > _MAX_ID:
        raise BadRequest(400, f"'group_id' is over {_MAX_ID} characters")
    _check_json_value(spec.metadata, "'metadata'")


def _opt_dict(body: dict[str, Any], key: str) -> dict[str, Any]:
    v = body.get(key)
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise BadRequest(400, f"{key!r} must be a JSON object, got {type(v).__name__}")
    return v


class SessionAPI:
    """The session API's routes on one proxy, over a :class:`SampleCollector` (``collector``)
    that holds the sample state. Attributes may be changed before or while serving."""

    def __init__(
        self,
        proxy: SessionHost,
        *,
        picker: Picker | None = default_picker,
        postprocess: Postprocess | None = default_postprocess,
        max_request_bytes: int = 1 << 20,
        max_payload_bytes: int = 4 << 30,
        grace_s: float = 300.0,
    ) -> None:
        self.proxy = proxy
        #: Largest JSON body accepted by the session routes (metadata, options).
        self.max_request_bytes = max_request_bytes
        #: Builders and collected payloads of the proxy's sessions.
        self.collector = SampleCollector(picker=picker, postprocess=postprocess,
                                         max_payload_bytes=max_payload_bytes, grace_s=grace_s)

    # The collector's knobs, settable here as before the split.
    @property
    def picker(self) -> Picker | None:
        """Which leaves become samples (see ``tracewire.samples``)."""
        return self.collector.picker

    @picker.setter
    def picker(self, value: Picker | None) -> None:
        self.collector.picker = value

    @property
    def postprocess(self) -> Postprocess | None:
        """The hook run over each collect's samples."""
        return self.collector.postprocess

    @postprocess.setter
    def postprocess(self, value: Postprocess | None) -> None:
        self.collector.postprocess = value

    @property
    def max_payload_bytes(self) -> int:
        """Largest samples payload built for one collect; bigger answers 413."""
        return self.collector.max_payload_bytes

    @max_payload_bytes.setter
    def max_payload_bytes(self, value: int) -> None:
        self.collector.max_payload_bytes = value

    @property
    def grace_s(self) -> float:
        """How long a collected payload is still served after DELETE or expiry."""
        return self.collector.grace_s

    @grace_s.setter
    def grace_s(self, value: float) -> None:
        self.collector.grace_s = value

    # -- bookkeeping -----------------------------------------------------------------------
    def sweep(self, now: float | None = None) -> None:
        """Forget sample state of sessions gone from the registry and payloads past grace
        (the proxy's sweeper calls it)."""
        self.collector.sweep(self.proxy.registry, now)

    async def on_cleanup(self, _app: web.Application) -> None:
        """Detach every builder."""
        self.collector.close()

    def check_token(self, request: web.Request) -> None:
        """``BadRequest(401)`` unless the request carries the proxy's trainer token."""
        given = bearer(request)
        if not secret_matches(given, self.proxy.session_token):
            if self._probe(request, given):
                # Agents probe their base URL (Claude Code HEADs /sessions/{id} before it
                # connects): the answer tells an agent nothing about where a token lives.
                raise BadRequest(401, "unauthorized")
            raise BadRequest(401, "missing or wrong session token (Authorization: Bearer "
                                  "<token>; the proxy's TRACEWIRE_SESSION_TOKEN)")

    def _probe(self, request: web.Request, given: str) -> bool:
        """Whether a refused request is an agent's read rather than a trainer's mistake: a
        HEAD, or a GET with no bearer token or an agent's own session secret."""
        if request.method == "HEAD":
            return True
        if request.method != "GET":
            return False
        if given:
            cred = given
        elif "Authorization" in request.headers:
            return False  # a malformed trainer header: it gets the hint
        else:
            cred = request.headers.get("x-api-key", "")
        return not cred or (cred.isascii() and self.proxy.registry.by_secret(cred) is not None)

    async def _read_body(self, request: web.Request) -> bytes:
        # JSON only: a text/plain POST needs no CORS preflight, so a web page could send it.
        ctype = content_type(request)
        if ctype != "application/json" and not ctype.endswith("+json"):
            raise BadRequest(415, f"content type must be application/json, not {ctype!r}")
        return await read_body(request, self.max_request_bytes)

    async def _read_json(self, request: web.Request) -> dict[str, Any]:
        body = await self._read_body(request)
        if not body.strip():
            return {}
        try:
            obj = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise BadRequest(400, f"request body is not valid JSON: {exc}") from exc
        if not isinstance(obj, dict):
            raise BadRequest(400, "request body must be a JSON object")
        return obj

    # -- routes ----------------------------------------------------------------------------
    async def create(self, request: web.Request) -> web.StreamResponse:
        """``POST /sessions``."""
        body = await self._read_body(request)
        try:
            spec = decode_spec(body)
        except ValueError as exc:
            raise BadRequest(400, str(exc)) from exc
        except RecursionError as exc:
            raise BadRequest(400, "request body nests too deeply") from exc
        if len(body) > _INLINE_CHECK:
            await asyncio.to_thread(_check_spec, spec)
        else:
            _check_spec(spec)
        try:
            session = self.proxy.create_session(spec)
        except LimitError as exc:
            raise _refuse(429, exc) from exc
        self.collector.builder(session)
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
            raise _refuse(404, exc) from exc

    async def summary(self, request: web.Request) -> web.StreamResponse:
        """``GET /sessions/{id}``."""
        session = self._session(request)
        counts = await self.collector.summary(session)
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
                "collected": self.collector.has_collected(session.id),
                **tito,
            }
        )

    async def samples(self, request: web.Request) -> web.StreamResponse:
        """``POST /sessions/{id}/samples``."""
        sid = request.match_info["sid"]
        body = await self._read_json(request)
        unknown = set(body) - _SAMPLES_KEYS
        if unknown:
            raise BadRequest(
                400, f"unknown fields {sorted(unknown)}; allowed {sorted(_SAMPLES_KEYS)}"
            )
        max_seq_len = opt_int(body, "max_seq_len", bounds=(1, _MAX_INT))
        overrides = _opt_dict(body, "metadata")
        _check_json_value(overrides, "'metadata'")
        try:
            session = self.proxy.registry.get(sid)
        except SessionError as exc:
            key = self.collector.request_key(max_seq_len, overrides)
            kept = self.collector.kept(sid, key)
            if kept is not None:  # a repeat after DELETE or expiry
                return await send_buffers(request, kept)
            raise _refuse(404, exc) from exc
        session.touch()
        parts = await self.collector.collect(session, max_seq_len, overrides)
        return await send_buffers(request, parts)

    async def delete(self, request: web.Request) -> web.StreamResponse:
        """``DELETE /sessions/{id}`` (repeating it is harmless: 200 with ``already``)."""
        sid = request.match_info["sid"]
        try:
            self.proxy.registry.delete(sid)
            already = None
        except SessionError as exc:
            if exc.reason == GoneReason.NEVER_EXISTED:
                raise _refuse(404, exc) from exc
            already = str(exc)
        self.collector.closed(sid)
        return _json({"session_id": sid, "status": SessionStatus.CLOSED, "already": already})


def add_session_routes(app: web.Application, proxy: SessionHost, **options: Any) -> SessionAPI:
    """Mount the session API on ``app`` (the proxy's) and return its :class:`SessionAPI`.

    ``options`` go to :class:`SessionAPI` (``picker``, ``postprocess``, caps, ``grace_s``).
    Calling it again on the same app returns the existing API unchanged, so a user can
    mount it with custom hooks before ``Proxy.start()`` mounts the defaults. The host
    calls :meth:`SessionAPI.sweep` periodically (``Proxy`` does, from its one sweeper).
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
    app.on_cleanup.append(api.on_cleanup)
    return api
