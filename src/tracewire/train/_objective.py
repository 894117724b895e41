"""The policy-gradient objective: group-normalized advantages and clipped importance weights.

Per sampled token with advantage ``A``, current log-probability ``lp`` and the sampler's
``lp_old``, the ratio is ``r = exp(lp - lp_old)`` and the objective PPO's
``min(r A, clip(r, 1 - eps, 1 + eps) A)``; its gradient is ``A r grad(lp)`` where the
unclipped term is the smaller one and 0 where the clip is active. On-policy ``r`` is 1.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

__all__ = ["group_advantages", "pg_coefficients"]

_F64 = npt.NDArray[np.float64]


def group_advantages(rewards: Sequence[float], groups: Sequence[str]) -> _F64:
    """``(r - mean) / (std + 1e-6)`` within each group; 0 for a group whose rewards are equal."""
    r = np.asarray(rewards, dtype=np.float64)
    out = np.zeros_like(r)
    keys = list(groups)
    for g in set(keys):
        idx = np.array([i for i, k in enumerate(keys) if k == g])
        sub = r[idx]
        sd = float(sub.std())
        if sd > 1e-12:
            out[idx] = (sub - sub.mean()) / (sd + 1e-6)
    return out


def pg_coefficients(
    lp: _F64, lp_old: _F64, advantage: _F64 | float, clip: float = 0.2
) -> tuple[_F64, _F64, npt.NDArray[np.bool_]]:
    """Per token: the weight of ``grad(lp)`` in the objective's gradient, the ratio, and
    whether the clip was active (its gradient is then 0)."""
    ratio = np.exp(lp - lp_old)
    a = np.broadcast_to(advantage, ratio.shape)
    clipped = np.where(a >= 0, ratio > 1.0 + clip, ratio < 1.0 - clip)
    coef = np.where(clipped, 0.0, a * ratio)
    return coef, ratio, clipped
