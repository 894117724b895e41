"""Samples as torch tensors, for trainers that want them (torch imported only here)."""

from __future__ import annotations

from typing import Any

from ._sample import Sample

__all__ = ["to_torch"]

_FIELDS = ("status", "prompt_len", "leaf", "trace_id", "group_id", "group_index",
           "finish_reason", "metadata", "spans", "empty_reason")


def to_torch(samples: list[Sample]) -> list[dict[str, Any]]:
    """Samples as dicts of torch tensors (``tokens``, ``loss_mask``, ``logprobs``) plus the
    scalar fields; needs torch installed."""
    try:
        import torch
    except ImportError as exc:
        raise ImportError("tensors='torch' needs torch installed") from exc
    out: list[dict[str, Any]] = []
    for s in samples:
        # Decoded arrays are read-only views of the payload; torch wants writable memory.
        d: dict[str, Any] = {
            "tokens": torch.from_numpy(s.tokens.copy()),
            "loss_mask": torch.from_numpy(s.loss_mask.copy()),
            "logprobs": None if s.logprobs is None else torch.from_numpy(s.logprobs.copy()),
        }
        for name in _FIELDS:
            d[name] = getattr(s, name)
        d["response_len"] = s.response_len
        out.append(d)
    return out
