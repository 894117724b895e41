"""Parsing an upstream body or chunk with its top-level prompt ids array left unparsed
(the array can be ~100k ints late in a session; the turn reads it lazily, see ``_prompt``)."""

from __future__ import annotations

from typing import Any

import orjson

from ._rawjson import SENTINEL, RawSpan, cut_array

__all__ = ["cut_ok", "cut_prompt", "loads_split"]

_PROMPT_KEYS = (b"prompt_token_ids", b"input_ids")


def cut_prompt(data: bytes) -> tuple[bytes, RawSpan, str] | None:
    """Cheap first step of :func:`loads_split`: (the body with its prompt ids array replaced
    by the placeholder, where the array lies, its key), or None when there is none."""
    for key in _PROMPT_KEYS:
        cut = cut_array(data, key)
        if cut is not None:
            return cut[0], cut[1], key.decode()
    return None


def cut_ok(d: Any, name: str) -> bool:
    """Whether ``d`` (the parsed cut body) holds the placeholder at the top level, i.e. the
    cut array was the prompt ids the full parse would read."""
    return isinstance(d, dict) and d.get(name) == SENTINEL and (
        name == "prompt_token_ids" or d.get("prompt_token_ids") is None)


def loads_split(data: bytes) -> tuple[dict[str, Any], RawSpan | None]:
    """Parse an upstream body or chunk, leaving its top-level prompt ids array unparsed:
    returns (the object with that array replaced by a placeholder, where the array lies).
    Falls back to a full parse (span None) when the array is not found at the top level.
    ``ValueError`` when the JSON is malformed or not an object."""
    cut = cut_prompt(data)
    if cut is not None:
        try:
            d = orjson.loads(cut[0])
        except orjson.JSONDecodeError:
            d = None
        if cut_ok(d, cut[2]):
            return d, cut[1]
    d = orjson.loads(data)
    if not isinstance(d, dict):
        raise ValueError("not a JSON object")
    return d, None
