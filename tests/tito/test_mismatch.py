"""The mismatch report: a clean token-in/token-out branch reports 0; benign differences
(non-canonical sampling, re-serialized arguments, stripped think) are classified benign;
a deliberately broken junction or close token is flagged."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tracewire.tito import (
    DifferenceKind,
    PromptBuilder,
    TokenSession,
    mismatch_report,
    parse_completion,
)

from .helpers import TOOLS, completion_text, sample_ids, tool_results


def _branch(b: PromptBuilder, family: str, *, canonical: bool, compact: bool, think: bool
            ) -> tuple[list[int], list[bool], list[dict[str, Any]]]:
    s = TokenSession(b)
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."},
                                  {"role": "user", "content": "start"}]
    ids: list[int] = []
    mask: list[bool] = []
    for t in range(5):
        plan = s.plan(msgs, TOOLS)
        comp = sample_ids(b, completion_text(family, t, think=think, compact=compact),
                          canonical=canonical)
        a = parse_completion(b.tok.decode(comp), b.family).as_message()
        s.commit(plan, a, comp, ended_by_stop=True)
        prompt = plan.prompt_ids
        mask = mask + [False] * (len(prompt) - len(ids)) + [True] * len(comp)
        ids = prompt + comp
        msgs.append(a)
        if t < 4:
            msgs += tool_results(t, a["tool_calls"], 2)
            if t == 2:
                msgs.append({"role": "user", "content": "more"})
    return ids, mask, msgs


def test_clean_branch_reports_zero(builder: PromptBuilder, family: str) -> None:
    ids, mask, msgs = _branch(builder, family, canonical=True, compact=False, think=False)
    rep = mismatch_report(builder, ids, mask, msgs, TOOLS)
    if family != "qwen3":  # Qwen3's last assistant turn gains an empty <think> on re-render
        assert rep.differences == [] and rep.mismatch == 0
    assert rep.mismatch == 0


def test_benign_differences(builder: PromptBuilder, family: str) -> None:
    ids, mask, msgs = _branch(builder, family, canonical=False, compact=True, think=True)
    rep = mismatch_report(builder, ids, mask, msgs, TOOLS)
    assert rep.differences and rep.mismatch == 0, rep.differences[:3]
    kinds = set(rep.counts())
    assert DifferenceKind.RETOKENIZED in kinds or DifferenceKind.ASSISTANT_TEXT in kinds


def test_broken_bridge_is_flagged(builder: PromptBuilder, family: str) -> None:
    ids, mask, msgs = _branch(builder, family, canonical=True, compact=False, think=False)
    fam = builder.family
    close = fam.stop_ids[0]
    # Drop the first close token that ends a turn: a bridge that lost it.
    at = ids.index(close, ids.index(close) + 1) if family != "llama3" else ids.index(close, 5)
    broken_ids = ids[:at] + ids[at + 1:]
    broken_mask = mask[:at] + mask[at + 1:]
    rep = mismatch_report(builder, broken_ids, broken_mask, msgs, TOOLS)
    assert rep.mismatch >= 1 and rep.counts().get("special", 0) >= 1
    if fam.junction:
        nl = builder.tok.encode(fam.junction)
        j = at + 1 if ids[at + 1:at + 1 + len(nl)] == nl else None
        if j is not None:
            no_junction = ids[:j] + ids[j + len(nl):]
            rep2 = mismatch_report(builder, no_junction, mask[:j] + mask[j + len(nl):],
                                   msgs, TOOLS)
            assert rep2.counts().get("prompt_text", 0) >= 1


def test_length_cut_last_turn_is_not_a_difference(builder: PromptBuilder,
                                                  family: str) -> None:
    ids, mask, msgs = _branch(builder, family, canonical=True, compact=False, think=False)
    # The last turn stopped by length, so it has no close token; its message is the text
    # sampled so far, which the canonical render closes.
    close = builder.family.stop_ids[0]
    assert ids[-1] == close
    cut_ids, cut_mask = ids[:-1], mask[:-1]
    rep = mismatch_report(builder, cut_ids, cut_mask, msgs, TOOLS, cut=True)
    assert rep.mismatch == 0 and rep.counts().get("special", 0) == 0, rep.differences[:3]
    # Not said to be cut, the same branch is a lost close token.
    assert mismatch_report(builder, cut_ids, cut_mask, msgs, TOOLS).counts()["special"] == 1
    # A lost close anywhere else is still a bug: drop the previous one, keep the turn's end.
    at = len(ids) - 1 - ids[:-1][::-1].index(close) - 1
    broken = ids[:at] + ids[at + 1:-1]
    rep2 = mismatch_report(builder, broken, mask[:at] + mask[at + 1:-1], msgs, TOOLS,
                           cut=True)
    assert rep2.counts().get("special", 0) >= 1


def test_length_cut_on_a_newline_is_not_a_lost_close(builder: PromptBuilder,
                                                     family: str) -> None:
    # Seen on llama-server: the model's last sampled id before the length cut was "\n",
    # the same id as the template's junction, and the message text was trimmed. The
    # canonical render's close + junction must both go, not only the close.
    junction = builder.family.junction
    if not junction:
        pytest.skip(f"{family} has no junction: the ambiguity cannot arise")
    ids, mask, msgs = _branch(builder, family, canonical=True, compact=False, think=False)
    nl = builder.tok.encode(junction)
    assert ids[-1] == builder.family.stop_ids[0]
    cut_ids, cut_mask = ids[:-1] + nl, mask[:-1] + [True] * len(nl)
    rep = mismatch_report(builder, cut_ids, cut_mask, msgs, TOOLS, cut=True)
    assert rep.mismatch == 0 and rep.counts().get("special", 0) == 0, rep.differences[:3]
    # The sampled newline the message lacks is the model's own text: benign, but reported
    # (one difference more than the uncut branch has; Qwen3's has its empty <think>).
    clean = mismatch_report(builder, ids, mask, msgs, TOOLS)
    assert sum(rep.counts().values()) == sum(clean.counts().values()) + 1
    last = rep.differences[-1]
    assert (last.kind, last.recorded_text, last.canonical_text) == ("assistant_text", junction, "")
    # Not said to be cut, the same branch lost its close token.
    assert mismatch_report(builder, cut_ids, cut_mask, msgs, TOOLS).counts()["special"] == 1


async def test_runs_off_the_loop(builder: PromptBuilder, family: str) -> None:
    ids, mask, msgs = _branch(builder, family, canonical=True, compact=False, think=False)
    rep = await asyncio.to_thread(mismatch_report, builder, ids, mask, msgs, TOOLS)
    assert rep.summary()["mismatch"] == 0
