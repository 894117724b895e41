"""The bounds every token-in/token-out reply's ids are checked against before anything is
recorded: int32, the tokenizer's vocabulary, the requested length."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ._errors import UpstreamShapeError

__all__ = ["ID_BOUND", "LENGTH_SLACK", "check_ids"]

#: Ids are int32 on the trace: anything at or above this is not an id.
ID_BOUND = 2**31
#: Tokens a server may add past ``max_tokens`` (llama-server finishes a multi-byte UTF-8
#: character that the limit split; at most 3 more bytes, one token each).
LENGTH_SLACK = 3


def check_ids(ids: Sequence[int], *, vocab_size: int | None = None,
              max_tokens: int | None = None, what: str = "completion") -> None:
    """Refuse (502) ``ids`` that are not integers in ``[0, vocab_size)`` (``[0, 2**31)``
    without one) or more than ``max_tokens`` (+ :data:`LENGTH_SLACK`); vectorised, so a
    200k-id reply costs milliseconds."""
    if max_tokens is not None and len(ids) > max_tokens + LENGTH_SLACK:
        raise UpstreamShapeError(f"upstream reply has {len(ids)} {what} ids for max_tokens "
                                 f"{max_tokens}; not recorded")
    if not len(ids):
        return
    try:
        arr = np.asarray(ids)
    except (ValueError, TypeError, OverflowError) as exc:
        raise UpstreamShapeError(f"upstream reply: {what} ids are not a flat list") from exc
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise UpstreamShapeError(f"upstream reply: {what} ids are not all integers in "
                                 f"[0, {ID_BOUND}); not recorded")
    bound = min(vocab_size, ID_BOUND) if vocab_size else ID_BOUND
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi >= bound:
        bad = lo if lo < 0 else hi
        where = "the vocabulary" if vocab_size else "int32"
        raise UpstreamShapeError(f"upstream reply: {what} id {bad} is outside {where} "
                                 f"[0, {bound}); not recorded")
