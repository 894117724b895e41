"""Rescoring a recorded sequence the way it was sampled: what a trainer of this model needs.

From token ids alone it rebuilds every constraint a turn was sampled under (the chat
grammar, canonical tokenization, and the declared tool names read back from the prompt's
``# Tools`` block) and returns, for each position of the loss mask, the log-probability of
the recorded token under a :class:`Policy` and, when asked, its gradient.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ._constraints import DecodeState
from ._engine import Engine
from ._policy import ContextKey, Policy
from ._template import ChatTemplate

__all__ = ["Rescored", "rescore"]

_F64 = npt.NDArray[np.float64]


@dataclass
class Rescored:
    """Per scored position: its index, token, previous token, log-probability, and (with
    ``grad``) the gradient of that log-probability with respect to the scores."""

    positions: npt.NDArray[np.int64]
    tokens: npt.NDArray[np.int64]
    prev: npt.NDArray[np.int64]  # previous token (-1 at position 0): the pair row it used
    logprobs: _F64
    grads: _F64 | None  # [positions, vocab]
    keys: list[tuple[ContextKey, ...]]  # context rows each position used (with ``grad``)


def rescore(
    engine: Engine, template: ChatTemplate, tokens: Sequence[int] | npt.NDArray[np.integer],
    loss_mask: Sequence[int] | npt.NDArray[np.integer],
    prompt_len: int, policy: Policy | None, temperature: float = 1.0, top_p: float = 1.0,
    grad: bool = False,
) -> Rescored:
    """Log-probabilities of ``tokens[i]`` for every ``i >= prompt_len`` with ``loss_mask[i]``.

    The tool-choice mode is the server's default: ``auto`` when the prompt declares tools,
    else ``none`` (a harness that sends another ``tool_choice`` shows up as a mismatch).
    """
    ids = [int(t) for t in tokens]
    mask = [int(m) for m in loss_mask]
    names = template.declared_tools(ids[:prompt_len])
    st = DecodeState(tool_choice="auto" if names else "none", names=engine.name_ids(names))
    order = engine.model.max_order
    pos: list[int] = []
    lps: list[float] = []
    gs: list[_F64] = []
    keys: list[tuple[ContextKey, ...]] = []
    for i, t in enumerate(ids):
        if i >= prompt_len and mask[i]:
            ctx = ids[max(0, i - order) : i]
            if grad:
                if policy is None:
                    raise ValueError("a gradient needs a policy")
                lp, g = engine.logprob_grad(ctx, st, t, temperature, top_p, policy)
                gs.append(g)
                keys.append(Policy.context_keys(ctx))
            else:
                q = engine.distribution(ctx, st, temperature, top_p, policy)
                with np.errstate(divide="ignore"):
                    lp = max(float(np.log(q[t])), -9999.0)
            pos.append(i)
            lps.append(lp)
        engine.cons.advance(st, t)
    p = np.array(pos, dtype=np.int64)
    arr = np.array(ids, dtype=np.int64)
    prev = np.where(p > 0, arr[np.maximum(p - 1, 0)], -1) if p.size else p
    grads = (np.stack(gs) if gs else np.zeros((0, engine.tok.vocab_size))) if grad else None
    return Rescored(p, arr[p] if p.size else p, prev, np.array(lps, dtype=np.float64), grads,
                    keys)
