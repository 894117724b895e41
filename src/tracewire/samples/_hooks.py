"""Default hooks for trees: which leaves become samples, and who trains a shared turn.

Both are plain callables the caller may replace; they run in a worker thread, and an
exception in either becomes a :class:`tracewire.HookError` naming the hook.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from .._errors import HookError
from ..trace import Trace
from ._sample import Sample

__all__ = [
    "Picker",
    "Postprocess",
    "default_picker",
    "default_postprocess",
    "hook_name",
    "run_picker",
    "run_postprocess",
]

#: ``picker(trace, leaves) -> leaves to keep``; ``leaves`` are the leaf node indices whose
#: branch holds at least one model turn, in creation order.
Picker = Callable[[Trace, list[int]], Sequence[int]]
#: ``postprocess(trace, samples) -> samples``; samples come in leaf order.
Postprocess = Callable[[Trace, list[Sample]], Sequence[Sample]]


def default_picker(trace: Trace, leaves: list[int]) -> list[int]:
    """Drop retried attempts: a leaf is superseded when its parent got a later child (the
    harness asked again from the same point). Dropped leaves are listed in the payload."""
    if not leaves:
        return []
    nodes = trace.nodes
    # Latest child per parent among nodes created after the earliest leaf (node indices
    # grow with creation time; a linear conversation scans nothing).
    latest: dict[int, int] = {}
    for i in range(min(leaves) + 1, len(nodes)):
        p = nodes[i].parent
        if p is not None:
            latest[p] = i
    keep: list[int] = []
    for leaf in leaves:
        p = nodes[leaf].parent
        if p is None or latest.get(p, leaf) <= leaf:
            keep.append(leaf)
    return keep


def default_postprocess(trace: Trace, samples: list[Sample]) -> list[Sample]:
    """Make each shared model turn trainable only in the earliest sample holding it: later
    samples get mask 0 over the part of that completion the earlier ones already cover."""
    if len(samples) < 2:
        return samples
    covered: dict[int, int] = {}  # completion node -> tokens of it already trainable
    for s in samples:
        spans = s.spans
        mask = s.loss_mask
        copied = False
        # Turns shared with earlier samples lie on a common root path: always a prefix.
        k = 0
        while k < len(spans) and spans[k][0] in covered:
            node, start, end = spans[k]
            have = covered[node]
            stop = min(end, start + have)
            if stop > start:
                if not copied:
                    # Sample arrays may be views of the trace's columns: copy first.
                    mask = np.array(mask, dtype=np.uint8)
                    copied = True
                mask[start:stop] = 0
            if end - start > have:
                covered[node] = end - start
            k += 1
        for node, start, end in spans[k:]:
            covered[node] = end - start
        if copied:
            mask.flags.writeable = False
            s.loss_mask = mask
    return samples


def hook_name(hook: object, *, qualified: bool = False) -> str:
    """The name a user hook goes by: its ``__name__`` (else its repr), as the proxy records
    it in ``Call.hooks``; ``qualified``: its ``__qualname__`` first, for error messages."""
    if qualified:
        # Error messages name the hook precisely (``Trainer.pick``, ``f.<locals>.g``).
        return str(getattr(hook, "__qualname__", None) or getattr(hook, "__name__", None)
                   or hook)
    # Records keep the short name they have always had, so traces compare across versions.
    return str(getattr(hook, "__name__", repr(hook)))


def run_picker(picker: Picker, trace: Trace, candidates: list[int]) -> list[int]:
    """Call ``picker``; its errors and answers outside ``candidates`` become HookError."""
    try:
        picked = list(picker(trace, list(candidates)))
    except Exception as exc:
        raise HookError(f"hook picker {hook_name(picker, qualified=True)} raised {exc!r}"
                        ) from exc
    allowed = set(candidates)
    bad = [x for x in picked if x not in allowed]
    if bad:
        raise HookError(
            f"hook picker {hook_name(picker, qualified=True)} returned {bad[:5]}, not among "
            f"leaves {candidates[:20]}"
        )
    return sorted(set(picked))


def run_postprocess(postprocess: Postprocess, trace: Trace, samples: list[Sample]) -> list[Sample]:
    """Call ``postprocess``; its errors and non-Sample answers become HookError."""
    name = hook_name(postprocess, qualified=True)
    try:
        out = list(postprocess(trace, samples))
    except Exception as exc:
        raise HookError(f"hook postprocess {name} raised {exc!r}") from exc
    if not all(isinstance(s, Sample) for s in out):
        raise HookError(f"hook postprocess {name} returned non-Samples")
    return out
