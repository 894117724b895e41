"""BranchTip: the kept branch list is reused only when the proxy's ids are a prefix of it."""

from __future__ import annotations

import numpy as np

from tracewire.tito import BranchTip, PromptBuilder, TokenSession

from .helpers import TOOLS


def test_tip_reuse_fork_and_mismatch(builder: PromptBuilder) -> None:
    s = TokenSession(builder)
    msgs = [{"role": "user", "content": "hi"}]
    tip = BranchTip()
    first = s.plan_on(msgs, TOOLS, new=1, base_ids=None, base_sampled=False)
    completion = [*builder.tok.encode("hello"), builder.family.stop_ids[0]]
    tip.keep(first, None, completion)
    branch = np.asarray(first.prompt_ids + completion, dtype=np.int32)
    kept = tip.ids
    assert kept == branch.tolist() and tip.arr is not None
    # The next turn extends the whole branch: the kept list itself is lent, not rebuilt.
    got = tip.take(branch.copy())
    assert got is kept and tip.ids is None  # lent out: a concurrent turn converts its own
    assert tip.take(branch.copy()) == branch.tolist()
    # A fork (a prefix) reuses the list cut to the prefix; different ids never reuse it.
    tip.ids, tip.arr = kept, branch
    n = len(first.prompt_ids)
    fork = tip.take(branch[:n].copy())
    assert fork is kept and fork == first.prompt_ids
    other = branch.copy()
    other[1] += 1
    tip.ids, tip.arr = branch.tolist(), branch
    assert tip.take(other) == other.tolist() and tip.take(other) is not None
