"""HTTP helpers of the viewer: JSON responses, query-parameter parsing, error middleware.

Every failure leaves as a JSON body ``{"error": str}`` with a fitting status, so a bad
request never takes the server down and a client always gets something it can read.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from enum import StrEnum
from typing import Any

import numpy as np
import orjson
from aiohttp import web

__all__ = [
    "ID_RE",
    "Order",
    "bad_request",
    "error",
    "error_middleware",
    "json_bytes",
    "json_response",
    "not_found",
    "param_bool",
    "param_choice",
    "param_float",
    "param_int",
    "param_order",
    "param_str",
]

log = logging.getLogger("tracewire.view")

#: Shape of an id the viewer accepts in a URL; anything else is a 404 before any lookup.
ID_RE = re.compile(r"^[A-Za-z0-9_\-]{1,128}$")

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def json_bytes(data: Any) -> bytes:
    """``data`` as JSON by orjson (numpy arrays allowed, NaN as null); a big answer is encoded
    in the worker thread that built it, not on the event loop."""
    return orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)


def json_response(data: Any, *, status: int = 200, headers: Mapping[str, str] | None = None
                  ) -> web.Response:
    """A JSON response (``data`` already encoded when it is ``bytes``)."""
    body = data if isinstance(data, bytes) else json_bytes(data)
    return web.Response(
        body=body, status=status, content_type="application/json", headers=headers
    )


def error(cls: type[web.HTTPException], message: str) -> web.HTTPException:
    """An HTTP error of class ``cls`` carrying ``{"error": message}`` as JSON."""
    return cls(text=orjson.dumps({"error": message}).decode(), content_type="application/json")


def _as_json(exc: web.HTTPException) -> web.HTTPException:
    # Some HTTP errors take required arguments of their own (405: the method and what is
    # allowed, which also sets the Allow header); rebuild those with them.
    body = orjson.dumps({"error": exc.reason}).decode()
    if isinstance(exc, web.HTTPMethodNotAllowed):
        return web.HTTPMethodNotAllowed(
            exc.method, exc.allowed_methods, text=body, content_type="application/json"
        )
    try:
        return type(exc)(text=body, content_type="application/json")
    except TypeError:  # another error class with required arguments: keep it as it is
        return exc


def bad_request(message: str) -> web.HTTPException:
    """A 400 carrying ``{"error": message}``."""
    return error(web.HTTPBadRequest, message)


def not_found(message: str) -> web.HTTPException:
    """A 404 carrying ``{"error": message}``."""
    return error(web.HTTPNotFound, message)


def param_str(q: Mapping[str, str], name: str, *, max_len: int = 200) -> str | None:
    """An optional string parameter, bounded in length."""
    v = q.get(name)
    if v is None or v == "":
        return None
    if len(v) > max_len:
        raise bad_request(f"parameter {name!r} is longer than {max_len} characters")
    return v


def param_int(q: Mapping[str, str], name: str, default: int, *, lo: int, hi: int) -> int:
    """An integer parameter in ``[lo, hi]``; malformed or out of range is a 400."""
    v = q.get(name)
    if v is None or v == "":
        return default
    try:
        n = int(v)
    except ValueError:
        raise bad_request(f"parameter {name!r} must be an integer, got {v[:40]!r}") from None
    if not lo <= n <= hi:
        raise bad_request(f"parameter {name!r} must be in [{lo}, {hi}], got {n}")
    return n


def param_float(q: Mapping[str, str], name: str) -> float | None:
    """An optional finite float parameter."""
    v = q.get(name)
    if v is None or v == "":
        return None
    try:
        x = float(v)
    except ValueError:
        raise bad_request(f"parameter {name!r} must be a number, got {v[:40]!r}") from None
    if not np.isfinite(x):
        raise bad_request(f"parameter {name!r} must be finite")
    return x


def param_choice(q: Mapping[str, str], name: str, choices: tuple[str, ...],
                 default: str | None = None) -> str | None:
    """A parameter that must be one of ``choices``."""
    v = q.get(name)
    if v is None or v == "":
        return default
    if v not in choices:
        raise bad_request(f"parameter {name!r} must be one of {', '.join(choices)}")
    return v


class Order(StrEnum):
    """A listing's direction (the ``order`` parameter of the index, groups and compare)."""

    ASC = "asc"
    DESC = "desc"


def param_order(q: Mapping[str, str]) -> Order:
    """The ``order`` parameter (default ascending)."""
    return Order(param_choice(q, "order", tuple(Order), Order.ASC) or Order.ASC)


def param_bool(q: Mapping[str, str], name: str) -> bool | None:
    """An optional boolean parameter (``1/0/true/false/yes/no``)."""
    v = q.get(name)
    if v is None or v == "":
        return None
    low = v.lower()
    if low in ("1", "true", "yes"):
        return True
    if low in ("0", "false", "no"):
        return False
    raise bad_request(f"parameter {name!r} must be a boolean")


@web.middleware
async def error_middleware(request: web.Request, handler: _Handler) -> web.StreamResponse:
    """Turn every exception into a JSON error response; the server keeps serving."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.content_type == "application/json" or exc.status < 400:
            raise
        raise _as_json(exc) from None
    except Exception:
        log.exception("viewer request %s %s failed", request.method, request.path_qs)
        raise error(web.HTTPInternalServerError, "internal error; see the server log") from None
