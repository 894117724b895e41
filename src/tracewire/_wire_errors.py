"""Errors across a process boundary: an error becomes ``{"type", "message"[, "reason"]}``
and is rebuilt on the other side as the same class of the error tree (``_errors``).

Used by the env server's ZMQ answers and by the proxy's session API over HTTP.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from . import _errors
from ._errors import TracewireError

__all__ = ["error_body", "error_from_body"]


def _tree() -> dict[str, type[TracewireError]]:
    out: dict[str, type[TracewireError]] = {}
    todo: list[type[TracewireError]] = [TracewireError]
    while todo:
        cls = todo.pop()
        if cls.__module__ == _errors.__name__:
            out[cls.__name__] = cls
        todo.extend(cls.__subclasses__())
    return out


_ERRORS = _tree()


def error_body(exc: BaseException | str, message: str = "", **extra: Any) -> dict[str, Any]:
    """The wire form of an error (or of a class name and message): its class name, its
    message, its ``reason`` when it has one, plus ``extra`` fields."""
    if isinstance(exc, str):
        return {"type": exc, "message": message, **extra}
    body: dict[str, Any] = {"type": type(exc).__name__, "message": message or str(exc)}
    reason = getattr(exc, "reason", "")
    if isinstance(reason, str) and reason:
        body["reason"] = reason
    return {**body, **extra}


def error_from_body(body: dict[str, Any], where: str = "",
                    default: type[TracewireError] = TracewireError,
                    known: Collection[type[TracewireError]] | None = None) -> TracewireError:
    """Rebuild the error ``body`` describes (``where`` is appended to the message). A type
    outside ``known`` (default: the whole tree) becomes ``default`` with the type's name in
    front of the message."""
    name = str(body.get("type", default.__name__))
    message = str(body.get("message", "")) or name
    cls = _ERRORS.get(name, default)
    if known is not None and cls not in known:
        cls = default
    text = f"{message} ({where})" if where else message
    if cls is default and name != default.__name__:
        text = f"{name}: {text}"
    exc = cls(text)
    reason = body.get("reason")
    if isinstance(reason, str) and reason and hasattr(exc, "reason"):
        exc.reason = reason
    return exc
