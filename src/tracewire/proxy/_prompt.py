"""The upstream's prompt token ids, read in O(new tokens) when the prompt extends the last
one recorded.

vLLM returns the whole prompt's ids every turn (~100k ints at turn 1,000). The session keeps
the raw JSON text of the last committed prompt (a reference to that response body, not a
copy) and the node whose path holds exactly those ids. When a new response's array starts
with that text followed by ``,`` (a memcmp), only the tail after it is parsed; the first
``base_len`` ids are known to be the path of ``base`` without materializing them.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

import numpy as np
import orjson
from numpy.typing import NDArray

from ._rawjson import RawSpan, skip_ws

__all__ = ["PromptCache", "PromptIds", "as_ids", "parse_full", "parse_tail"]

_EMPTY: array[int] = array("i")


def as_ids(ids: object) -> NDArray[np.int32] | None:
    """An int32 array of a flat JSON list of ids; None for anything else."""
    if not isinstance(ids, list) or (ids and isinstance(ids[0], list)):
        return None
    return np.array(ids, dtype=np.int32)


@dataclass(slots=True)
class PromptIds:
    """A prompt: ``full`` ids, or the ids of the path ending at ``base`` (``base_len`` of
    them, already in the trace) followed by ``tail``. ``raw`` is where the array's JSON text
    lies in the upstream body (None when it came from parsed chunks).

    ``tail`` is the few ids a turn adds as an int32 ``array`` rather than numpy: it is
    compared and appended to the trace's columns without a numpy call (see ``Columns``)."""

    full: NDArray[np.int32] | None = None
    base: int | None = None
    base_len: int = 0
    tail: array[int] = field(default_factory=lambda: _EMPTY)
    raw: RawSpan | None = None

    def __len__(self) -> int:
        if self.full is not None:
            return int(self.full.shape[0])
        return self.base_len + len(self.tail)


# Not frozen: made several times a turn, and a frozen dataclass's __init__ costs 4x.
@dataclass(slots=True)
class PromptCache:
    """The last committed prompt's raw text and the node whose path holds its ids."""

    raw: RawSpan
    stop: int  # raw.data[raw.start:stop] is the array text before its closing bracket
    node: int
    n: int


def parse_full(span: RawSpan) -> PromptIds | None:
    """Parse the whole array (the slow path: first turn, or a prompt that does not extend
    the cached one); None when it is not a flat list of ids."""
    try:
        ids = as_ids(orjson.loads(span.view()))
    except (orjson.JSONDecodeError, TypeError, ValueError, OverflowError):
        return None
    return None if ids is None else PromptIds(full=ids, raw=span)


def parse_tail(span: RawSpan, cache: PromptCache | None) -> PromptIds | None:
    """The prompt as ``cache``'s ids + a parsed tail when ``span``'s text starts with the
    cached text; None when it does not (or the tail is not a flat list of ids)."""
    if cache is None:
        return None
    c = cache.raw
    length = cache.stop - c.start
    data = span.data
    if length > span.end - span.start or not data.startswith(
            memoryview(c.data)[c.start:cache.stop], span.start):
        return None
    p = span.start + length
    if length == 1:  # the cached prompt was empty: everything after "[" is new
        text = b"[" + data[p:span.end]
    else:
        p = skip_ws(data, p)
        if p >= span.end:
            return None
        if data[p] == 0x5D:  # "]": exactly the cached prompt
            return PromptIds(base=cache.node, base_len=cache.n, raw=span)
        if data[p] != 0x2C:  # not ",": e.g. the last cached id continues with more digits
            return None
        text = b"[" + data[p + 1:span.end]
    try:
        # TypeError for anything but ints (a nested list, a float), OverflowError past int32.
        tail = array("i", orjson.loads(text))
    except (orjson.JSONDecodeError, TypeError, ValueError, OverflowError):
        return None
    return PromptIds(base=cache.node, base_len=cache.n, tail=tail, raw=span)
