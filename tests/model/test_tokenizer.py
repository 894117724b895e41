"""Tokenizer, template and engine-level properties (no HTTP)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracewire import ModelError
from tracewire.model import SPECIAL_TOKENS, ChatTemplate, get_engine, load_tokenizer, render_chat
from tracewire.model._engine import Generation, SamplingParams


@given(st.text(max_size=200))
@settings(max_examples=300, deadline=None)
def test_roundtrip_any_unicode(text: str) -> None:
    tok = load_tokenizer()
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert all(not tok.is_special(t) for t in ids)


def test_special_spellings_in_content_stay_text() -> None:
    tok = load_tokenizer()
    ids = tok.encode("a<|eot|>b")
    assert tok.eot_id not in ids
    assert tok.encode_with_special("a<|eot|>b") == [*tok.encode("a"), tok.eot_id,
                                                   *tok.encode("b")]
    assert len(SPECIAL_TOKENS) == 8


def test_template_layout() -> None:
    tok = load_tokenizer()
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    ids = render_chat([{"role": "user", "content": "hi"},
                       {"role": "assistant", "content": None, "tool_calls": [
                           {"id": "x", "type": "function",
                            "function": {"name": "f", "arguments": "{\"a\": 1}"}}]},
                       {"role": "tool", "tool_call_id": "x", "content": "2"}], tools)
    assert tok.decode(ids) == (
        '<|system|># Tools\n{"name": "f", "parameters": {}}<|eot|><|user|>hi<|eot|>'
        '<|assistant|><|call|>f<|args|>{"a": 1}<|endcall|><|eot|><|tool|>2<|eot|><|assistant|>')


def test_template_rejects_bad_messages() -> None:
    tpl = ChatTemplate(load_tokenizer())
    with pytest.raises(ModelError):
        tpl.render([{"role": "wizard", "content": "x"}])
    with pytest.raises(ModelError):
        tpl.render([{"role": "user", "content": 5}])
    with pytest.raises(ModelError):
        tpl.render([{"role": "assistant", "tool_calls": [{"function": {"name": "f",
                                                                       "arguments": {}}}]}])


@pytest.mark.parametrize("temperature", [0.0, 1.0, 1.6, 2.0])
def test_sampled_turns_rerender_to_sampled_ids(temperature: float) -> None:
    """Engine-level fidelity: any generated turn renders back to exactly its ids."""
    e = get_engine()
    tpl = ChatTemplate(e.tok)
    prompts = ["Convert 12 km to mi.", "héllo wörld ✓ 🎲", "What is the capital of France?", ""]
    for seed in range(60):
        msgs = [{"role": "user", "content": prompts[seed % len(prompts)]}]
        tools = [{"type": "function", "function": {"name": "calculator"}}] if seed % 2 else None
        prompt = tpl.render(msgs, tools)
        gen = Generation(e, prompt, SamplingParams(temperature=temperature, max_tokens=120),
                         np.random.default_rng(seed))
        steps = []
        while (s := gen.step()) is not None:
            steps.append(s)
            assert s.logprob <= 0.0 and np.isfinite(s.logprob)
        if gen.finish_reason != "stop":
            continue
        parsed = tpl.parse(gen.tokens)
        turn = {"role": "assistant", "content": parsed.content or None,
                "tool_calls": [{"id": "c", "type": "function",
                                "function": {"name": n, "arguments": a}}
                               for n, a in parsed.tool_calls] or None}
        again = tpl.render([*msgs, turn], tools, add_generation_prompt=False)
        assert again == prompt + gen.tokens


def test_scoring_reproduces_generation_logprobs() -> None:
    e = get_engine()
    tpl = ChatTemplate(e.tok)
    prompt = tpl.render([{"role": "user", "content": "What is the plural of mouse?"}])
    for temp, top_p in [(1.0, 1.0), (0.7, 0.9), (0.0, 1.0)]:
        gen = Generation(e, prompt, SamplingParams(temperature=temp, top_p=top_p, max_tokens=40,
                                                   tool_choice="auto"),
                         np.random.default_rng(3))
        got = []
        while (s := gen.step()) is not None:
            got.append(s.logprob)
        scored = e.score(prompt + gen.tokens, temp, top_p)[len(prompt):]
        assert [s.logprob for s in scored if s is not None] == got


def test_any_allowed_walk_is_canonical_and_rerenders() -> None:
    """Pick uniformly among *allowed* tokens (not model-weighted): every finished turn must
    still re-render to exactly its ids. This tests the constraint itself, model aside."""
    e = get_engine()
    tpl = ChatTemplate(e.tok)
    tools = [{"type": "function", "function": {"name": "calculator"}}]
    prompt = tpl.render([{"role": "user", "content": "x"}], tools)
    rng = np.random.default_rng(0)
    finished = 0
    for _ in range(300):
        st = e.state_after(prompt)
        ids: list[int] = []
        for _step in range(40):
            allowed = np.flatnonzero(e.cons.allowed(st))
            t = int(rng.choice(allowed))
            ids.append(t)
            e.cons.advance(st, t)
            if t == e.tok.eot_id:
                break
        else:
            continue
        finished += 1
        parsed = tpl.parse(ids)
        turn = {"role": "assistant", "content": parsed.content,
                "tool_calls": [{"function": {"name": n, "arguments": a}}
                               for n, a in parsed.tool_calls]}
        assert tpl.render([{"role": "user", "content": "x"}, turn], tools,
                          add_generation_prompt=False) == prompt + ids
    assert finished > 20
