"""A trainable parametrization of the built-in model: log-linear scores over its contexts.

The score of next token ``j`` after a context ending in ``prev`` is
``log p_ngram(j | context) + bias[j] + pair[prev, j]``; the distribution sampled from is
that score restricted to the allowed tokens (the same constraints as the untrained model),
divided by the temperature, softmax-normalized and cut to the ``top_p`` nucleus. Weights are
immutable arrays, so a request keeps the version it started with while a new one is swapped
in. :func:`logprob_grad` is the exact gradient of a sampled token's log-probability under
that distribution (the nucleus is piecewise constant in the weights, so it is fixed).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["Policy", "nucleus", "softmax_scores"]

_F64 = npt.NDArray[np.float64]
_B = npt.NDArray[np.bool_]


def _frozen(a: _F64) -> _F64:
    a.flags.writeable = False
    return a


@dataclass(frozen=True, eq=False)
class Policy:
    """One version of the trainable weights: ``bias[V]`` and ``pair[V, V]`` (read-only)."""

    version: int
    bias: _F64
    pair: _F64

    @classmethod
    def zeros(cls, vocab_size: int, version: int = 0) -> Policy:
        """All-zero weights: exactly the untrained model's distribution (up to rounding)."""
        return cls(version, _frozen(np.zeros(vocab_size)),
                   _frozen(np.zeros((vocab_size, vocab_size))))

    @property
    def vocab_size(self) -> int:
        """Size of the vocabulary the weights cover."""
        return int(self.bias.size)

    def offset(self, context: Sequence[int]) -> _F64:
        """What the weights add to the n-gram log-probabilities after ``context``."""
        if not context:
            return self.bias
        out: _F64 = self.bias + self.pair[int(context[-1])]
        return out

    def updated(self, d_bias: _F64, d_pair: _F64, version: int) -> Policy:
        """A new version with ``d_bias``/``d_pair`` added (this one is left unchanged)."""
        return Policy(version, _frozen(self.bias + d_bias), _frozen(self.pair + d_pair))

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
