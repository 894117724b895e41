"""Raw-JSON surgery for big bodies: find one top-level array by its key, swap it for a
placeholder so the rest parses small, and splice it back when rendering.

Harnesses resend the whole history and vLLM returns the whole prompt's token ids every
turn, so these arrays grow with the conversation; everything else in the body does not.
The placeholder is a random string per process: finding it where it was put proves the key
found by a byte search was the top-level one (a nested key of the same name, or a
duplicate, makes the caller fall back to a full parse).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

import orjson

__all__ = ["SENTINEL", "SENTINEL_JSON", "RawSpan", "cut_array", "render", "skip_ws",
           "skip_ws_back"]

SENTINEL = "tracewire-raw-" + secrets.token_hex(12)
SENTINEL_JSON = orjson.dumps(SENTINEL)
_WS = frozenset(b" \t\r\n")
_BACKSLASH = 0x5C
_OPEN = 0x5B


# Not frozen: made several times a turn, and a frozen dataclass's __init__ costs 4x.
@dataclass(slots=True)
class RawSpan:
    """``data[start:end]`` is one JSON array (``[`` .. ``]``) inside a body; kept by
    reference, never copied."""

    data: bytes
    start: int
    end: int

    def view(self) -> memoryview:
        """The array's bytes, uncopied."""
        return memoryview(self.data)[self.start:self.end]

    def content_end(self) -> int:
        """Offset of the closing ``]`` with the whitespace before it skipped back over: the
        array text up to there is a prefix of any array that extends this one."""
        return skip_ws_back(self.data, self.end - 1, self.start + 1)


def skip_ws(data: bytes, i: int) -> int:
    """First offset at or after ``i`` that is not JSON whitespace (``len(data)`` if none)."""
    n = len(data)
    while i < n and data[i] in _WS:
        i += 1
    return i


def skip_ws_back(data: bytes, end: int, stop: int = 0) -> int:
    """Offset just past the last byte before ``end`` that is not JSON whitespace (never
    below ``stop``)."""
    while end > stop and data[end - 1] in _WS:
        end -= 1
    return end


def find_value(data: bytes, key: bytes) -> int:
    """Offset of the value after the first ``"key":`` in ``data`` (-1 if absent). The match
    may be nested; callers prove it is top-level with the placeholder."""
    needle = b'"' + key + b'":'
    i = data.find(needle)
    if i < 0:
        # Some servers put a space before the colon.
        i = data.find(b'"' + key + b'" :')
        if i < 0:
            return -1
        needle = b'"' + key + b'" :'
    if i > 0 and data[i - 1] == _BACKSLASH:
        return -1  # inside a string: give up, the full parse decides
    return skip_ws(data, i + len(needle))


def cut_array(data: bytes, key: bytes) -> tuple[bytes, RawSpan] | None:
    """Split ``data`` into (the body with the flat array under ``key`` replaced by the
    placeholder, where that array was). None when there is no such array (absent, null,
    or not a plain array start)."""
    j = find_value(data, key)
    if j < 0 or j >= len(data) or data[j] != _OPEN:
        return None
    # A flat array of numbers ends at the first "]"; anything else (nested arrays,
    # strings holding "]") leaves unbalanced text behind, which fails the parse of the rest.
    k = data.find(b"]", j)
    if k < 0:
        return None
    return data[:j] + SENTINEL_JSON + data[k + 1:], RawSpan(data, j, k + 1)


def render(d: Any, span: RawSpan | None) -> bytes:
    """``orjson.dumps(d)`` with the placeholder (if still present) replaced by the array."""
    out = orjson.dumps(d)
    if span is not None and SENTINEL_JSON in out:
        out = out.replace(SENTINEL_JSON, bytes(span.view()), 1)
    return out
