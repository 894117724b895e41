"""The linear report still finds bugs next to long benign differences: a lost junction right
after a 300-id answer sampled one token per character is its own ``prompt_text``
difference, not folded into the answer's benign one; ids outside the vocabulary (a bad
reply's) do not break it."""

from __future__ import annotations

from typing import Any

from tracewire.tito import PromptBuilder, TokenSession, mismatch_report, parse_completion

LONG = ("The answer to three plus three is six; Paris is sunny, Berlin rains. " * 5).strip()


def _branch(b: PromptBuilder) -> tuple[list[int], list[bool], list[dict[str, Any]]]:
    s = TokenSession(b)
    tok = b.tok
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "Be long."}]
    ids: list[int] = []
    mask: list[bool] = []
    for t in range(3):
        msgs.append({"role": "user", "content": f"question {t}"})
        plan = s.plan(msgs)
        comp = [*[i for ch in LONG for i in tok.encode(ch)], b.family.stop_ids[0]]
        a = parse_completion(tok.decode(comp), b.family).as_message()
        s.commit(plan, a, comp, ended_by_stop=True)
        prompt = plan.prompt_ids
        mask = mask + [False] * (len(prompt) - len(ids)) + [True] * len(comp)
        ids = prompt + comp
        msgs.append(a)
    return ids, mask, msgs


def test_a_lost_junction_after_a_long_retokenized_answer_is_flagged(
        builder: PromptBuilder, family: str) -> None:
    if not builder.family.junction:
        return  # Llama 3 has no junction to lose; covered by the other families
    ids, mask, msgs = _branch(builder)
    clean = mismatch_report(builder, ids, mask, msgs)
    assert clean.mismatch == 0 and clean.counts().get("retokenized", 0) >= 2
    stop = builder.family.stop_ids[0]
    nl = builder.tok.encode(builder.family.junction)
    # The close token of the first answer, then its junction: drop the junction.
    first_answer = mask.index(True)
    at = ids.index(stop, first_answer) + 1
    assert ids[at:at + len(nl)] == nl and at - first_answer > 256
    broken = ids[:at] + ids[at + len(nl):]
    bmask = mask[:at] + mask[at + len(nl):]
    rep = mismatch_report(builder, broken, bmask, msgs)
    assert rep.mismatch >= 1 and rep.counts().get("prompt_text", 0) >= 1, rep.counts()


def test_out_of_vocabulary_ids_are_a_difference_not_a_crash(builder: PromptBuilder) -> None:
    ids, mask, msgs = _branch(builder)
    at = len(ids) - 5
    bad = [*ids[:at], -7, 2**31 + 5, builder.tok.vocab_size + 3, *ids[at:]]
    bmask = [*mask[:at], True, True, True, *mask[at:]]
    rep = mismatch_report(builder, bad, bmask, msgs)
    assert rep.counts() and rep.recorded_tokens == len(bad)
