"""Completion parsing: Hermes/Qwen and Llama 3 tool calls, <think> reasoning, malformed calls
as text plus a flag, and the streamed parser agreeing with the whole-text parse."""

from __future__ import annotations

import random

import orjson
import pytest

from tracewire.tito import ChatTokenizer, Family, PromptBuilder, StreamParser, parse_completion


@pytest.fixture(scope="module")
def fams(toks: dict[str, ChatTokenizer]) -> dict[str, Family]:
    return {n: PromptBuilder(t).family for n, t in toks.items()}


def test_hermes_calls_and_content(fams: dict[str, Family]) -> None:
    text = ('Let me check.\n<tool_call>\n{"name": "get", "arguments": {"city": "Paris"}}\n'
            '</tool_call>\n<tool_call>\n{"name": "put", "arguments": {}}\n</tool_call>'
            '<|im_end|>')
    p = parse_completion(text, fams["qwen25"])
    assert p.content == "Let me check."
    assert [c.name for c in p.tool_calls] == ["get", "put"]
    assert orjson.loads(p.tool_calls[0].arguments) == {"city": "Paris"}
    assert not p.malformed and p.reasoning is None
    msg = p.as_message()
    assert msg["tool_calls"][0]["function"]["name"] == "get"


def test_think_block(fams: dict[str, Family]) -> None:
    p = parse_completion("<think>\nweigh it\n</think>\n\nAnswer: 4<|im_end|>", fams["qwen3"])
    assert p.reasoning == "weigh it" and p.content == "Answer: 4"
    cut = parse_completion("<think>\nstill thinking", fams["qwen3"])  # length cut
    assert cut.reasoning == "still thinking" and cut.content == ""
    opened = parse_completion("inner\n</think>\n\nout", fams["qwen3"], think_opened=True)
    assert opened.reasoning == "inner" and opened.content == "out"


@pytest.mark.parametrize("bad", [
    '<tool_call>\n{"name": "get", "arguments": {"city": \n</tool_call>',  # broken JSON
    '<tool_call>\n{"arguments": {}}\n</tool_call>',  # no name
    '<tool_call>\n{"name": "get", "arguments": {"a": 1}',  # never closed (length cut)
])
def test_malformed_call_is_text_with_flag(fams: dict[str, Family], bad: str) -> None:
    p = parse_completion("before " + bad, fams["qwen25"])
    assert p.tool_calls == []
    assert p.malformed == [bad]
    assert p.content == "before " + bad


def test_llama_json_calls(fams: dict[str, Family]) -> None:
    f = fams["llama3"]
    p = parse_completion('{"name": "lookup", "parameters": {"i": 3}}<|eot_id|>', f)
    assert [(c.name, orjson.loads(c.arguments)) for c in p.tool_calls] == [("lookup", {"i": 3})]
    assert p.content is None
    two = parse_completion('<|python_tag|>{"name": "a", "parameters": {}}; '
                           '{"name": "b", "parameters": {"x": 1}}', f)
    assert [c.name for c in two.tool_calls] == ["a", "b"]
    plain = parse_completion("The answer is {braces} here.<|eot_id|>", f)
    assert plain.content == "The answer is {braces} here." and not plain.tool_calls
    bad = parse_completion('{"name": "lookup", "parameters": {"i": }', f)
    assert not bad.tool_calls and bad.malformed and bad.content.startswith('{"name"')


CASES = {
    "qwen25": ['Hi there.\n<tool_call>\n{"name": "f", "arguments": {"a": [1, 2]}}\n</tool_call>'
               '<|im_end|>', "plain < text with <tool and <|im_ tails <|im_end|>",
               'x <tool_call>{"name": broken}</tool_call> y'],
    "qwen3": ['<think>\nplan: <tool_call> later\n</think>\n\nok\n<tool_call>\n'
              '{"name": "f", "arguments": {}}\n</tool_call><|im_end|>', "  no think  <|im_end|>"],
    "llama3": ['{"name": "f", "parameters": {"q": "a;b"}}<|eot_id|>', "  text {x}  <|eot_id|>",
               '<|python_tag|>{"name": "f", "parameters": {}}'],
}


@pytest.mark.parametrize("fam", sorted(CASES))
def test_streamed_parse_equals_whole(fams: dict[str, Family], fam: str) -> None:
    rng = random.Random(7)
    for text in CASES[fam]:
        whole = parse_completion(text, fams[fam])
        for _ in range(30):
            cuts = sorted(rng.sample(range(1, len(text)), k=min(len(text) - 1,
                                                               rng.randint(1, 12))))
            pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
            sp = StreamParser(fams[fam])
            events = [e for piece in pieces for e in sp.feed(piece)] + sp.close()
            content = "".join(e.text for e in events if e.kind == "content")
            reasoning = "".join(e.text for e in events if e.kind == "reasoning")
            calls = [e.call.name for e in events if e.kind == "tool_call" and e.call]
            assert content == (whole.content or "")
            assert reasoning == (whole.reasoning or "")
            assert calls == [c.name for c in whole.tool_calls]
            assert sp.result.content == whole.content
            # Markup is never relayed as it streams: no partial <tool_call> or stop token.
            if whole.tool_calls:
                assert "<tool_call>" not in content
            assert "<|im_end|>" not in content and "<|eot_id|>" not in content


def test_stream_relays_text_before_the_end(fams: dict[str, Family]) -> None:
    sp = StreamParser(fams["qwen25"])
    assert [e.text for e in sp.feed("Hello wor")] == ["Hello wor"]
    assert [e.text for e in sp.feed("ld <tool_")] == ["ld"]  # "<tool_" and " " wait
    assert sp.feed('call>{"name": "f", "arguments": {}}') == []  # held until it closes
    done = sp.feed("</tool_call>")
    assert [e.kind for e in done] == ["tool_call"]
