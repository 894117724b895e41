"""Dialect-correct HTTP errors and SSE framing for the proxy's answers."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

import orjson
from aiohttp import web

from .._errors import TracewireError

__all__ = ["BadRequest", "Dialect", "error_body", "error_response", "sse", "sse_error"]

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
                 close: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        #: The connection cannot carry another request (its body could not be read).
        self.close = close

    def response(self, dialect: Dialect) -> web.Response:
        """The error response in ``dialect``'s shape."""
        return error_response(dialect, self.status, self.message, self.code, close=self.close)


def error_body(dialect: Dialect, status: int, message: str,
               code: str | None = None) -> dict[str, Any]:
    """The error object a client of ``dialect`` expects."""
    if dialect is Dialect.ANTHROPIC:
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
    if dialect is Dialect.ANTHROPIC:
        return sse(error_body(Dialect.ANTHROPIC, 502, message), "error")
    return sse(error_body(Dialect.OPENAI, 502, message))
