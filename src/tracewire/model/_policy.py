"""A trainable parametrization of the built-in model: log-linear scores over its contexts.

The score of next token ``j`` after a context ending in ``prev`` is
``log p_ngram(j | context) + bias[j] + pair[prev, j] + sum_k rows[(k, last k ids)][j]``.
Context rows (orders in :data:`CONTEXT_ORDERS`) exist only for contexts that were trained
on, so a version costs memory in proportion to what it learned. The distribution sampled
from is that score restricted to the allowed tokens (the untrained model's constraints),
divided by the temperature, softmax-normalized and cut to the ``top_p`` nucleus. Weights
are immutable, so a request keeps the version it started with while a new one is swapped
in. ``Engine.logprob_grad`` is the exact gradient of a sampled token's log-probability
under that distribution (the nucleus is piecewise constant in the weights, so it is fixed).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

__all__ = ["CONTEXT_ORDERS", "Policy", "nucleus", "softmax_scores"]

#: Context lengths that get their own learned rows.
CONTEXT_ORDERS = (2, 4, 8)
ContextKey = tuple[int, tuple[int, ...]]

_F64 = npt.NDArray[np.float64]
_B = npt.NDArray[np.bool_]


def _frozen(a: _F64) -> _F64:
    a.flags.writeable = False
    return a


@dataclass(frozen=True, eq=False)
class Policy:
    """One version of the trainable weights: ``bias[V]``, ``pair[V, V]`` and sparse context
    ``rows`` (all read-only; a new version shares the rows it did not change)."""

    version: int
    bias: _F64
    pair: _F64
    rows: Mapping[ContextKey, _F64] = field(default_factory=dict)

    @classmethod
    def zeros(cls, vocab_size: int, version: int = 0) -> Policy:
        """All-zero weights: exactly the untrained model's distribution (up to rounding)."""
        return cls(version, _frozen(np.zeros(vocab_size)),
                   _frozen(np.zeros((vocab_size, vocab_size))), {})

    @staticmethod
    def context_keys(context: Sequence[int]) -> tuple[ContextKey, ...]:
        """Keys of the context rows that apply after ``context``."""
        n = len(context)
        return tuple((k, tuple(int(t) for t in context[n - k :]))
                     for k in CONTEXT_ORDERS if n >= k)

    @property
    def vocab_size(self) -> int:
        """Size of the vocabulary the weights cover."""
        return int(self.bias.size)

    def offset(self, context: Sequence[int]) -> _F64:
        """What the weights add to the n-gram log-probabilities after ``context``."""
        if not context:
            return self.bias
        out: _F64 = self.bias + self.pair[int(context[-1])]
        if self.rows:
            for key in self.context_keys(context):
                row = self.rows.get(key)
                if row is not None:
                    out += row
        return out

    def updated(self, d_bias: _F64, d_pair: _F64, version: int,
                d_rows: Mapping[ContextKey, _F64] | None = None) -> Policy:
        """A new version with the deltas added (this one is left unchanged)."""
        rows = dict(self.rows)
        for key, d in (d_rows or {}).items():
            old = rows.get(key)
            rows[key] = _frozen(d.copy() if old is None else old + d)
        return Policy(version, _frozen(self.bias + d_bias), _frozen(self.pair + d_pair), rows)

    def as_arrays(self) -> dict[str, _F64]:
        """The weights by name (e.g. for ``np.savez``)."""
        return {"bias": self.bias, "pair": self.pair,
                "version": np.array(self.version, dtype=np.float64)}


def softmax_scores(scores: _F64, allowed: _B, temperature: float) -> _F64 | None:
    """``softmax(scores / T)`` over ``allowed`` (zero elsewhere); None when nothing is allowed."""
    if not allowed.any():
        return None
    s = np.where(allowed, scores, -np.inf)
    if temperature > 0 and temperature != 1.0:
        s = s / temperature
    q: _F64 = np.exp(s - s.max())
    total = q.sum()
    if not total > 0 or not np.isfinite(total):
        return None
    q /= total
    return q


def nucleus(q: _F64, top_p: float) -> _F64:
    """``q`` cut to its smallest top-``top_p`` set (ties broken by id) and renormalized."""
    if top_p >= 1.0:
        return q
    order = np.argsort(-q, kind="stable")
    cs = np.cumsum(q[order])
    cut = int(np.searchsorted(cs, top_p * cs[-1])) + 1
    kept = np.zeros_like(q)
    keep = order[:cut]
    kept[keep] = q[keep]
    out: _F64 = kept / kept.sum()
    return out
