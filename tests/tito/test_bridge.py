"""Token-in/token-out prompts over fixture tokenizers of three template families: a 20-turn
tool-calling conversation bridges every turn, the ids are exactly previous prompt + sampled
ids + rendered suffix, and the families' quirks show up only in a full re-render."""

from __future__ import annotations

from typing import Any

import pytest

from tracewire.tito import (
    LengthRule,
    PromptBuilder,
    RerenderReason,
    TokenSession,
    TruncatedTurnError,
    parse_completion,
)

from .helpers import TOOLS, completion_text, sample_ids, tool_results


def run_conversation(b: PromptBuilder, family: str, turns: int = 20, *,
                     canonical_every: int = 2, compact: bool = True,
                     user_every: int = 5, system: bool = True
                     ) -> tuple[TokenSession, list[dict[str, Any]], list[int], list[str]]:
    """Drive ``turns`` turns; returns (session, final history, recorded ids, checks)."""
    s = TokenSession(b)
    msgs: list[dict[str, Any]] = ([{"role": "system", "content": "You are terse."}]
                                  if system else [])
    msgs.append({"role": "user", "content": "Look things up, one call per turn."})
    prev: list[int] | None = None
    recorded: list[int] = []
    for t in range(turns):
        plan = s.plan(msgs, TOOLS)
        prompt = plan.prompt_ids
        if prev is None:
            assert plan.new_branch and plan.reason is None
        else:
            assert not plan.new_branch, f"turn {t} re-rooted: {plan.reason}"
            assert plan.rendered is not None
            # The contract: previous prompt + sampled ids, verbatim, then the suffix.
            assert prompt == prev + plan.rendered.ids
            assert plan.rendered.ids == b.tok.encode(plan.rendered.text)
        text = completion_text(family, t, compact=compact)
        comp = sample_ids(b, text, canonical=(t % canonical_every == 0))
        parsed = parse_completion(b.tok.decode(comp), b.family)
        assert parsed.tool_calls and parsed.tool_calls[0].name == "lookup"
        assert not parsed.malformed
        assistant = parsed.as_message()
        s.commit(plan, assistant, comp, ended_by_stop=True)
        prev = prompt + comp
        recorded = prev
        msgs.append(assistant)
        msgs.extend(tool_results(t, assistant["tool_calls"], 1 + t % 2))
        if user_every and t % user_every == user_every - 1:
            msgs.append({"role": "user", "content": f"Good, continue ({t})."})
    return s, msgs, recorded, []


def test_twenty_turns_bridge_every_turn(builder: PromptBuilder, family: str) -> None:
    s, msgs, recorded, _ = run_conversation(builder, family)
    assert s.bridges == 19 and not s.rerenders
    text = builder.tok.decode(recorded)
    pos = 0
    last = max(i for i, m in enumerate(msgs) if m["role"] == "assistant")
    for m in msgs[:last + 1]:  # every message's text is in the recorded ids, in order
        piece = m["content"] if m["role"] != "assistant" else f"{m['content'] or ''}"
        if piece:
            found = text.find(piece.strip(), pos)
            assert found >= 0, (m, text[pos:pos + 200])
            pos = found


def test_non_canonical_ids_survive(builder: PromptBuilder, family: str) -> None:
    s = TokenSession(builder)
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    plan = s.plan(msgs, TOOLS)
    comp = sample_ids(builder, completion_text(family, 7), canonical=False)
    # Really non-canonical: re-tokenizing the text gives other ids.
    assert builder.tok.encode(builder.tok.decode(comp)) != comp
    assistant = parse_completion(builder.tok.decode(comp), builder.family).as_message()
    s.commit(plan, assistant, comp, ended_by_stop=True)
    msgs += [assistant, *tool_results(7, assistant["tool_calls"], 1)]
    nxt = s.plan(msgs, TOOLS)
    n = len(plan.prompt_ids)
    assert nxt.prompt_ids[n:n + len(comp)] == comp


def test_canonical_history_equals_full_rerender(builder: PromptBuilder, family: str) -> None:
    """With canonical sampling, template-style arguments and no new user query, the
    junction rule makes the recorded ids equal a full render: nothing is lost or added."""
    # Qwen3's template gives the last assistant turn an empty <think> block, so its
    # completions carry one; the others write plain text.
    b = builder
    s = TokenSession(b)
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."},
                                  {"role": "user", "content": "start"}]
    recorded: list[int] = []
    for t in range(6):
        plan = s.plan(msgs, TOOLS)
        text = completion_text(family, t, think=False, compact=False)
        comp = sample_ids(b, text)
        assistant = parse_completion(b.tok.decode(comp), b.family).as_message()
        s.commit(plan, assistant, comp, ended_by_stop=True)
        recorded = plan.prompt_ids + comp
        msgs += [assistant, *tool_results(t, assistant["tool_calls"], 2)]
    final = s.plan(msgs, TOOLS).prompt_ids
    assert final == b.render_full(msgs, TOOLS).ids
    assert final[:len(recorded)] == recorded


def test_rerender_differs_where_the_quirk_says(builder: PromptBuilder, family: str) -> None:
    b = builder
    _s, msgs, recorded, _ = run_conversation(b, family, turns=8, canonical_every=1)
    rec = b.tok.decode(recorded)
    full = b.render_full(msgs, TOOLS).text
    assert full != rec
    if family == "qwen3":
        # Past <think> blocks (before the last user query) are gone on re-render.
        assert "thinking 0" in rec and "thinking 0" not in full
    else:
        # Tool-call arguments are re-serialized by the template: {"i":0} -> {"i": 0}.
        assert '{"i":0}' in rec and '{"i":0}' not in full and '{"i": 0}' in full
    if family == "qwen25":
        plain = b.render_full([{"role": "user", "content": "x"}]).text
        assert plain.startswith("<|im_start|>system\nYou are Qwen")  # default system prompt


def test_llama_trims_content_on_rerender(toks: Any) -> None:
    b = PromptBuilder(toks["llama3"])
    s = TokenSession(b)
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "hello"}]
    plan = s.plan(msgs)
    comp = sample_ids(b, completion_text("llama3", 1, call=False, trailing=" \n"))
    assistant = parse_completion(b.tok.decode(comp), b.family).as_message()
    assert assistant["content"] == "done 1"
    s.commit(plan, assistant, comp, ended_by_stop=True)
    msgs += [assistant, {"role": "user", "content": "again"}]
    nxt = s.plan(msgs)
    assert not nxt.new_branch
    assert "done 1 \n<|eot_id|>" in b.tok.decode(nxt.prompt_ids)
    assert "done 1 \n" not in b.render_full(msgs).text


@pytest.mark.parametrize("rule", [LengthRule.CLOSE, LengthRule.REFUSE])
def test_length_cut_turn(toks: Any, family: str, rule: LengthRule) -> None:
    b = PromptBuilder(toks[family], length_rule=rule)
    s = TokenSession(b)
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "write a lot"}]
    plan = s.plan(msgs)
    comp = sample_ids(b, "step 1 and then", stop=False)
    assistant = parse_completion(b.tok.decode(comp), b.family).as_message()
    s.commit(plan, assistant, comp, ended_by_stop=False)
    msgs += [assistant, {"role": "user", "content": "go on"}]
    if rule is LengthRule.REFUSE:
        with pytest.raises(TruncatedTurnError) as ei:
            s.plan(msgs)
        assert ei.value.status == 409
        return
    nxt = s.plan(msgs)
    assert nxt.rendered is not None and nxt.rendered.synthesized_close
    n = len(plan.prompt_ids) + len(comp)
    assert nxt.prompt_ids[:n] == plan.prompt_ids + comp
    assert nxt.prompt_ids[n] == b.family.stop_ids[0]  # the synthesized close


def _two_turns(b: PromptBuilder, family: str) -> tuple[TokenSession, list[dict[str, Any]]]:
    s = TokenSession(b)
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "sys A"},
                                  {"role": "user", "content": "q1"}]
    for t in range(2):
        plan = s.plan(msgs, TOOLS)
        comp = sample_ids(b, completion_text(family, t))
        a = parse_completion(b.tok.decode(comp), b.family).as_message()
        s.commit(plan, a, comp, ended_by_stop=True)
        msgs += [a, *tool_results(t, a["tool_calls"], 1)]
    return s, msgs


@pytest.mark.parametrize("edit", ["compact", "assistant", "system", "retry"])
def test_changed_history_opens_a_counted_branch(builder: PromptBuilder, family: str,
                                                 edit: str) -> None:
    s, msgs = _two_turns(builder, family)
    if edit == "compact":
        new = [msgs[0], {"role": "user", "content": "Summary: two lookups done."}]
        want: RerenderReason | None = RerenderReason.HISTORY_CHANGED
    elif edit == "assistant":
        new = [dict(m) for m in msgs]
        new[2]["content"] = "edited"
        want = RerenderReason.ASSISTANT_EDITED
    elif edit == "system":
        new = [{"role": "system", "content": "sys B"}, *msgs[1:]]
        want = RerenderReason.SYSTEM_CHANGED
    else:
        new = msgs[:-1 - 0]
        want = None
    before = len(s.index._ends)
    plan = s.plan(new, TOOLS)
    if want is None:
        assert not plan.new_branch  # the same history bridges again
        return
    assert plan.new_branch and plan.reason is want
    assert s.rerenders == {want.value: 1}
    assert plan.prompt_ids == builder.render_full(new, TOOLS).ids
    assert len(s.index._ends) == before


def test_same_prompt_reuses_ids(builder: PromptBuilder, family: str) -> None:
    s = TokenSession(builder)
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "q"}]
    p1 = s.plan(msgs)
    comp = sample_ids(builder, "a")
    s.commit(p1, {"role": "assistant", "content": "a"}, comp, ended_by_stop=True)
    p2 = s.plan(msgs)  # a retry, or the group's second sample
    assert p2.continuation.kind == "same" and p2.prompt_ids == p1.prompt_ids


def test_first_turn_spans(builder: PromptBuilder) -> None:
    msgs = [{"role": "system", "content": "S1"}, {"role": "user", "content": "U1"},
            {"role": "assistant", "content": "A1"}, {"role": "user", "content": "U2"}]
    r = builder.render_full(msgs)
    assert len(r.spans) == 4
    assert r.spans[0][0] == 0
    for (a0, a1), (b0, _) in zip(r.spans, r.spans[1:], strict=False):
        assert a0 < a1 == b0
    for m, (a, z) in zip(msgs, r.spans, strict=True):
        assert m["content"] in builder.tok.decode(r.ids[a:z])
    assert r.spans[-1][1] < len(r.ids)  # the generation prompt belongs to no message
