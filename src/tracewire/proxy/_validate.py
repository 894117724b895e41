"""Checks at the proxy's input boundary: every value the proxy records is of the type the
trace schema declares, nested no deeper than the encoders go, so a trace that was answered
2xx always encodes, decodes and reads back from a store.

msgspec Structs do not validate on construction (only the decoder does), so a message built
from unchecked JSON would be accepted, recorded, and then fail to decode from disk. Refusals
are :class:`BadRequest` (400) naming where the bad value is (``messages[3].tool_call_id``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NoReturn

import msgspec
import orjson

from ..trace import Message
from ._http import BadRequest
from ._turn_types import chat_message

__all__ = ["MAX_DEPTH", "check_depth", "checked_message", "exact_arguments", "fail", "load_json",
           "load_object", "nested_too_deep", "opt_bool", "opt_int", "opt_list", "opt_number",
           "opt_str", "req_str", "type_name"]

#: Deepest nesting accepted in a recorded free-form value (content parts, sampling values,
#: tool schemas). orjson writes at most 254 levels and msgspec stops at the interpreter's
#: recursion limit; a record adds about ten levels around the value.
MAX_DEPTH = 64

_NAMES = {type(None): "null", bool: "boolean", int: "integer", float: "number", str: "string",
          list: "array", dict: "object"}
_msg_enc = msgspec.msgpack.Encoder()
_msg_dec = msgspec.msgpack.Decoder(Message)


def type_name(v: object) -> str:
    """The JSON name of a decoded value's type (for error messages)."""
    return _NAMES.get(type(v), type(v).__name__)


def fail(where: str, what: str) -> NoReturn:
    """Refuse the request: ``where`` names the value, ``what`` says what is wrong."""
    raise BadRequest(400, f"{where}: {what}" if where else what)


def nested_too_deep(v: object, limit: int = MAX_DEPTH) -> bool:
    """True when ``v`` nests arrays/objects more than ``limit`` levels (walked without
    recursion, so any depth the JSON parser let through is safe to check)."""
    if not isinstance(v, dict | list):
        return False
    stack: list[tuple[Any, int]] = [(v, 1)]
    while stack:
        x, d = stack.pop()
        if d > limit:
            return True
        items = x.values() if isinstance(x, dict) else x
        stack.extend((y, d + 1) for y in items if isinstance(y, dict | list))
    return False


def check_depth(v: object, where: str, limit: int = MAX_DEPTH) -> None:
    """Refuse ``v`` when it nests deeper than ``limit``."""
    if nested_too_deep(v, limit):
        fail(where, f"nested too deep (more than {limit} levels)")


def load_json(raw: bytes | memoryview, where: str) -> Any:
    """``orjson.loads`` with malformed input (bad UTF-8, over 1,024 levels) refused."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        fail(where, f"malformed JSON: {exc}")


def load_object(body: bytes) -> dict[str, Any]:
    """A request body that must be one JSON object."""
    d = load_json(body, "body")
    if not isinstance(d, dict):
        fail("body", f"must be a JSON object, got {type_name(d)}")
    return d


def opt_str(d: Mapping[str, Any], key: str, where: str, default: str | None = None
            ) -> str | None:
    """``d[key]`` when it is a string, ``default`` when absent or null; refused otherwise."""
    v = d.get(key)
    if v is None:
        return default
    if not isinstance(v, str):
        fail(f"{where}.{key}" if where else key, f"must be a string, got {type_name(v)}")
    return v


def req_str(d: Mapping[str, Any], key: str, where: str) -> str:
    """``d[key]``, which must be a string."""
    v = opt_str(d, key, where)
    if v is None:
        fail(f"{where}.{key}" if where else key, "is required (a string)")
    return v


def opt_int(d: Mapping[str, Any], key: str, where: str = "",
            bounds: tuple[int, int] | None = None) -> int | None:
    """``d[key]`` when it is an integer (not a boolean), within ``bounds`` (inclusive) when
    given; None when absent or null."""
    v = d.get(key)
    if v is None:
        return None
    if bounds is None:
        if not isinstance(v, int) or isinstance(v, bool):
            fail(f"{where}.{key}" if where else key, f"must be an integer, got {type_name(v)}")
        return v
    lo, hi = bounds
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        name = f"{where}.{key}" if where else key
        fail("", f"{name!r} must be an integer in [{lo}, {hi}] or null, got {str(v)[:40]}")
    return v


def opt_number(d: Mapping[str, Any], key: str, where: str = "") -> float | int | None:
    """``d[key]`` when it is a number (not a boolean); None when absent or null."""
    v = d.get(key)
    if v is not None and (not isinstance(v, int | float) or isinstance(v, bool)):
        fail(f"{where}.{key}" if where else key, f"must be a number, got {type_name(v)}")
    return v


def opt_bool(d: Mapping[str, Any], key: str, where: str = "") -> bool | None:
    """``d[key]`` when it is a boolean; None when absent or null."""
    v = d.get(key)
    if v is not None and not isinstance(v, bool):
        fail(f"{where}.{key}" if where else key, f"must be a boolean, got {type_name(v)}")
    return v


def opt_list(d: Mapping[str, Any], key: str, where: str = "") -> list[Any] | None:
    """``d[key]`` when it is an array; None when absent or null."""
    v = d.get(key)
    if v is not None and not isinstance(v, list):
        fail(f"{where}.{key}" if where else key, f"must be an array, got {type_name(v)}")
    return v


_MSG_STR_KEYS = ("tool_call_id", "name", "reasoning_content", "reasoning")


def _not_str(x: object) -> bool:
    return x is not None and not isinstance(x, str)


def _check_chat_dict(d: Any, where: str) -> None:
    # Every turn checks its new messages: the where-strings are built only on failure.
    if not isinstance(d, dict):
        fail(where, f"each message must be an object, got {type_name(d)}")
    if not isinstance(d.get("role"), str):
        fail(f"{where}.role", f"must be a string, got {type_name(d.get('role'))}")
    content = d.get("content")
    if isinstance(content, list):
        for j, part in enumerate(content):
            if not isinstance(part, dict):
                fail(f"{where}.content[{j}]", f"must be an object, got {type_name(part)}")
        check_depth(content, f"{where}.content")
    elif _not_str(content):
        fail(f"{where}.content", f"must be a string, an array of parts or null, got "
                                 f"{type_name(content)}")
    for key in _MSG_STR_KEYS:
        if _not_str(d.get(key)):
            opt_str(d, key, where)  # raises, naming the field
    tcs = d.get("tool_calls")
    if tcs is None:
        return
    if not isinstance(tcs, list):
        fail(f"{where}.tool_calls", f"must be an array, got {type_name(tcs)}")
    for j, tc in enumerate(tcs):
        fn = tc.get("function") if isinstance(tc, dict) else None
        if (isinstance(fn, dict) and not _not_str(tc.get("id"))
                and not _not_str(tc.get("type")) and not _not_str(fn.get("name"))
                and isinstance(fn.get("arguments", ""), str)):
            continue  # the common case, checked without building names
        w = f"{where}.tool_calls[{j}]"
        if not isinstance(tc, dict):
            fail(w, f"must be an object, got {type_name(tc)}")
        opt_str(tc, "id", w)
        opt_str(tc, "type", w)
        if not isinstance(fn, dict):
            fail(f"{w}.function", f"must be an object, got {type_name(fn)}")
        opt_str(fn, "name", f"{w}.function")
        args = fn.get("arguments")
        if args is not None and not isinstance(args, str | dict):
            fail(f"{w}.function.arguments", f"must be a string, got {type_name(args)}")
        if isinstance(args, dict):
            check_depth(args, f"{w}.function.arguments")


def checked_message(d: Any, where: str) -> Message:
    """The :class:`Message` an OpenAI chat message dict means, with every field checked
    against the trace schema (and proven to decode), or a 400 naming the bad field."""
    parsed = isinstance(d, bytes | memoryview)
    if parsed:
        d = load_json(d, where)
    _check_chat_dict(d, where)
    try:
        msg = chat_message(d)
        # The exact check the store's reader will make: what is recorded must decode. Text
        # that orjson parsed (valid UTF-8, no lone surrogates) in a message of checked
        # strings only (no parts, no tool calls) always does: most messages skip it.
        if not parsed or msg.tool_calls or not (msg.content is None or type(
                msg.content) is str):
            _msg_dec.decode(_msg_enc.encode(msg))
    except (ValueError, TypeError, RecursionError, OverflowError) as exc:
        fail(where, str(exc))
    return msg


def _canon(v: Any) -> bytes | None:
    try:
        return orjson.dumps(v, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        return None


def exact_arguments(call_id: str, value: Any, tool_args: Mapping[str, str] | None
                    ) -> str | None:
    """The arguments text the model produced for ``call_id`` (from the session's record)
    when it means ``value`` (the harness may have edited the call; then None)."""
    if not tool_args or not call_id:
        return None
    text = tool_args.get(call_id)
    if text is None:
        return None
    if isinstance(value, str):
        if value == text:
            return text
        try:
            value = orjson.loads(value)
        except orjson.JSONDecodeError:
            return None
    try:
        recorded = orjson.loads(text)
    except orjson.JSONDecodeError:
        # Unparseable text was shown to the harness as {"_raw": text} (see _anthropic).
        return text if value == {"_raw": text} else None
    want = _canon(value)
    return text if want is not None and want == _canon(recorded) else None
