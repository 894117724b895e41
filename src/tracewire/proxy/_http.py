"""The proxy app's HTTP pieces shared by its routes: bounded body reading, credentials,
dialect-correct errors and SSE framing."""

from __future__ import annotations

import hmac
from collections.abc import Sequence
from enum import StrEnum
from typing import Any

import orjson
from aiohttp import web

from .._errors import LimitError, TracewireError

__all__ = ["BadRequest", "Dialect", "bearer", "check_length", "content_type", "error_body",
           "error_response", "read_body", "secret_matches", "send_buffers", "sse", "sse_error"]

_SLICE = 1 << 20  # bytes per write of a big answer

_ANTHROPIC_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "not_found_error", 405: "invalid_request_error", 413: "request_too_large",
    415: "invalid_request_error", 429: "rate_limit_error",
}
_OPENAI_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
    405: "invalid_request_error", 413: "invalid_request_error", 415: "invalid_request_error",
    429: "rate_limit_error",
}


class Dialect(StrEnum):
    """The API family a harness speaks, which decides the shape of error bodies and events."""

    OPENAI = "openai"
    ANTHROPIC = "anthropic"


class BadRequest(TracewireError, ValueError):
    """Raised inside handlers for a 4xx answer in the request's dialect (a ``ValueError``:
    the request, not the proxy, is at fault)."""

    def __init__(self, status: int, message: str, code: str | None = None, *,
                 close: bool = False, error: TracewireError | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        #: The connection cannot carry another request (its body could not be read).
        self.close = close
        #: The error a session API client rebuilds from the answer (None: a ``ProxyError``
        #: with ``message``).
        self.error = error

    def response(self, dialect: Dialect) -> web.Response:
        """The error response in ``dialect``'s shape."""
        return error_response(dialect, self.status, self.message, self.code, close=self.close)


def content_type(request: web.Request) -> str:
    """The request's media type, lower case, without parameters ("" when none is sent)."""
    # Plain string work: aiohttp's content_type property runs a full MIME parser.
    return request.headers.get("Content-Type", "").partition(";")[0].strip().lower()


def _too_big(limit: int) -> BadRequest:
    msg = f"request body over {limit} bytes"
    return BadRequest(413, msg, error=LimitError(msg))


def check_length(request: web.Request, limit: int) -> None:
    """``BadRequest`` 413 when the request declares a body over ``limit`` bytes (for a
    route that refuses a declared size before anything else; ``read_body`` checks too)."""
    if request.content_length is not None and request.content_length > limit:
        raise _too_big(limit)


async def read_body(request: web.Request, limit: int) -> bytes:
    """The request body, at most ``limit`` bytes; ``BadRequest`` 413 past it (checked on
    the declared length before reading), 400 when the body cannot be decoded."""
    check_length(request, limit)
    try:
        if limit >= request.client_max_size:
            # aiohttp's own bound is the one that applies: its reader was measured the
            # cheapest on multi-MB bodies, so the turn routes keep it.
            try:
                return await request.read()
            except web.HTTPRequestEntityTooLarge as exc:
                raise _too_big(limit) from exc
        body = bytearray()
        while chunk := await request.content.readany():
            body += chunk
            if len(body) > limit:
                raise _too_big(limit)
        return bytes(body)
    except web.RequestPayloadError as exc:  # e.g. Content-Encoding: gzip, body is not
        request.content.feed_eof()  # nothing more to drain; the connection closes
        why = getattr(exc.__cause__, "message", "") or str(exc)
        raise BadRequest(400, f"unreadable request body: {why}", close=True) from exc


def bearer(request: web.Request) -> str:
    """The token of the request's ``Authorization: Bearer`` header ("" without one)."""
    auth = request.headers.get("Authorization", "")
    return auth[7:].strip() if auth[:7].lower() == "bearer " else ""


def secret_matches(given: str, expected: str) -> bool:
    """Whether ``given`` is ``expected``, compared in constant time; "" never matches."""
    return bool(given) and hmac.compare_digest(given.encode("utf-8", "replace"),
                                               expected.encode("utf-8", "replace"))


async def send_buffers(request: web.Request, parts: Sequence[bytes | memoryview],
                       content_type: str = "application/octet-stream") -> web.StreamResponse:
    """Answer 200 with ``parts`` as the body, written as they are (no joined copy) in
    slices, so a multi-MB body never sits in one loop-blocking write."""
    resp = web.StreamResponse(headers={"Content-Type": content_type})
    resp.content_length = sum(memoryview(p).nbytes for p in parts)
    await resp.prepare(request)
    for part in parts:
        view = memoryview(part).cast("B")
        for i in range(0, view.nbytes, _SLICE):
            await resp.write(view[i : i + _SLICE])
    await resp.write_eof()
    return resp


def error_body(dialect: Dialect, status: int, message: str,
               code: str | None = None) -> dict[str, Any]:
    """The error object a client of ``dialect`` expects."""
    if dialect == Dialect.ANTHROPIC:
        return {"type": "error",
                "error": {"type": _ANTHROPIC_TYPES.get(status, "api_error"), "message": message}}
    return {"error": {"message": message, "type": _OPENAI_TYPES.get(status, "api_error"),
                      "param": None, "code": code}}


def error_response(dialect: Dialect, status: int, message: str, code: str | None = None, *,
                   close: bool = False) -> web.Response:
    """A JSON error response in the dialect's shape (``close``: with ``Connection: close``)."""
    body = orjson.dumps(error_body(dialect, status, message, code))
    resp = web.Response(status=status, body=body, content_type="application/json")
    if close:
        resp.force_close()
    return resp


def sse(data: Any, event: str | None = None) -> bytes:
    """One SSE event (``data`` is JSON-encoded unless already bytes)."""
    payload = data if isinstance(data, bytes) else orjson.dumps(data)
    head = b"event: " + event.encode() + b"\n" if event else b""
    return head + b"data: " + payload + b"\n\n"


def sse_error(dialect: Dialect, message: str) -> bytes:
    """An in-stream error event in the dialect's form."""
    if dialect == Dialect.ANTHROPIC:
        return sse(error_body(Dialect.ANTHROPIC, 502, message), "error")
    return sse(error_body(Dialect.OPENAI, 502, message))
