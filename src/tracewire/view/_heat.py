"""What each token of a branch is, for the token view's heat map: prompt, trained sample,
masked-out sample, or a junction token between turns.

A junction is what a chat template writes after an assistant turn's close token and before
the next message (ChatML's ``\\n`` after ``<|im_end|>``), plus a close token synthesized for
a turn that ended by length. Token-in/token-out records those ids at the head of the prompt
node that follows the sampled one; which ids they are comes from the run's tokenizer
(``tito.probe_family``). Without a tokenizer no token is called a junction.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from ..trace import Trace

__all__ = ["JUNCTION", "KINDS", "PROMPT", "SAMPLED", "SAMPLED_MASKED", "TRAINED_PROMPT",
           "Boundary", "token_kinds"]

PROMPT = 0  # prompt side, not trained
SAMPLED = 1  # sampled by the model and trained (mask 1)
SAMPLED_MASKED = 2  # sampled, but left out of the loss (mask 0)
JUNCTION = 3  # template text between turns (or a synthesized close token), not sampled
TRAINED_PROMPT = 4  # not sampled, yet mask 1 (a trainer's choice worth seeing)
#: Kind code -> name (the page's legend).
KINDS = {PROMPT: "prompt", SAMPLED: "sampled", SAMPLED_MASKED: "sampled, masked out",
         JUNCTION: "junction", TRAINED_PROMPT: "prompt, trained"}


@dataclass(frozen=True)
class Boundary:
    """A template's turn boundary as ids: the close token and the junction after it."""

    close: int | None
    junction: tuple[int, ...]


def token_kinds(trace: Trace, path: list[int], boundary: Boundary | None) -> NDArray[np.uint8]:
    """One kind code per token of the branch along ``path`` (root to leaf)."""
    mask = trace.columns.mask
    ids = trace.columns.ids
    parts: list[NDArray[np.uint8]] = []
    prev_sampled = False
    prev_last: int | None = None
    for i in path:
        node = trace.nodes[i]
        m = mask[node.start : node.end]
        if node.sampled:
            k = np.where(m > 0, SAMPLED, SAMPLED_MASKED).astype(np.uint8)
        else:
            k = np.where(m > 0, TRAINED_PROMPT, PROMPT).astype(np.uint8)
            if prev_sampled and boundary is not None and node.end > node.start:
                x = ids[node.start : node.end]
                at = 0
                if boundary.close is not None and int(x[0]) == boundary.close \
                        and prev_last != boundary.close:
                    k[0] = JUNCTION
                    at = 1
                j = boundary.junction
                if j and len(x) - at >= len(j) and tuple(int(v) for v in x[at : at + len(j)]) == j:
                    k[at : at + len(j)] = JUNCTION
        parts.append(k)
        if node.end > node.start:
            prev_sampled = node.sampled
            prev_last = int(ids[node.end - 1])
    if not parts:
        return np.zeros(0, dtype=np.uint8)
    return np.concatenate(parts)
