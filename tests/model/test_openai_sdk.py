"""Drive the server with the official openai SDK: sync, async, streaming, tool calls."""

from __future__ import annotations

import json

import model_data as md
import openai
import pytest

from tracewire.model import MODEL_NAME


def _tools_msgs() -> list[dict[str, str]]:
    return [{"role": "system", "content": md.TOOLS_SYSTEM},
            {"role": "user", "content": "Use the calculator to compute (47 + 5) * 3."}]


def test_models_says_tiny_demo(base_url: str) -> None:
    client = openai.OpenAI(base_url=base_url, api_key="none")
    (model,) = client.models.list().data
    assert model.id == MODEL_NAME
    assert "not a useful assistant" in (model.model_extra or {})["description"].lower()


def test_sync_chat_and_seed_reproduces(base_url: str) -> None:
    client = openai.OpenAI(base_url=base_url, api_key="none")
    msgs = [{"role": "system", "content": md.COMMAND_SYSTEM},
            {"role": "user", "content": "What is the capital of Norway?"}]
    outs = [client.chat.completions.create(model=MODEL_NAME, messages=msgs, seed=s,  # type: ignore[arg-type]
                                           extra_body={"return_token_ids": True})
            for s in (11, 11, 12)]
    ids = [o.choices[0].model_extra["token_ids"] for o in outs]  # type: ignore[index]
    assert ids[0] == ids[1]
    assert outs[0].choices[0].message.content == outs[1].choices[0].message.content
    assert outs[0].usage is not None and outs[0].usage.completion_tokens == len(ids[0])


def test_tool_calls_and_n(base_url: str) -> None:
    client = openai.OpenAI(base_url=base_url, api_key="none")
    r = client.chat.completions.create(model=MODEL_NAME, messages=_tools_msgs(),  # type: ignore[arg-type]
                                       tools=md.TOOLS, n=6, seed=5, temperature=1.0)  # type: ignore[arg-type]
    assert len(r.choices) == 6
    called = [c for c in r.choices if c.message.tool_calls]
    assert called, "the model learned to call tools for these tasks"
    for c in called:
        assert c.finish_reason == "tool_calls"
        call = c.message.tool_calls[0]  # type: ignore[index]
        assert call.type == "function" and call.function.name in ("calculator", "convert_units")
        assert isinstance(call.function.arguments, str)


def test_tool_choice_none_and_named(base_url: str) -> None:
    client = openai.OpenAI(base_url=base_url, api_key="none")
    r = client.chat.completions.create(model=MODEL_NAME, messages=_tools_msgs(), tools=md.TOOLS,  # type: ignore[arg-type]
                                       tool_choice="none", n=4, seed=1)
    assert all(not c.message.tool_calls for c in r.choices)
    r = client.chat.completions.create(
        model=MODEL_NAME, messages=_tools_msgs(), tools=md.TOOLS, seed=2,  # type: ignore[arg-type]
        tool_choice={"type": "function", "function": {"name": "convert_units"}})
    calls = r.choices[0].message.tool_calls
    assert calls and calls[0].function.name == "convert_units"  # type: ignore[union-attr]


def _collect(chunks: list[openai.types.chat.ChatCompletionChunk]) -> tuple[str, list[int], list[float], list[tuple[str, str]], str | None]:  # noqa: E501
    text, ids, lps, calls, finish = "", [], [], [], None
    for ch in chunks:
        for c in ch.choices:
            text += c.delta.content or ""
            ids += (c.model_extra or {}).get("token_ids", [])
            if c.logprobs and c.logprobs.content:
                lps += [e.logprob for e in c.logprobs.content]
            for tc in c.delta.tool_calls or []:
                calls.append((tc.function.name, tc.function.arguments))  # type: ignore[union-attr]
            finish = c.finish_reason or finish
    return text, ids, lps, calls, finish


@pytest.mark.parametrize("case", ["text", "tools", "stop"])
def test_streaming_concatenates_to_non_streaming(base_url: str, case: str) -> None:
    client = openai.OpenAI(base_url=base_url, api_key="none")
    kw: dict[str, object] = {"model": MODEL_NAME, "logprobs": True,
                             "extra_body": {"return_token_ids": True}, "temperature": 1.3}
    if case == "tools":
        kw |= {"messages": _tools_msgs(), "tools": md.TOOLS}
    else:
        kw |= {"messages": [{"role": "user", "content": "Sam has 12 apples and gets 9 more."}]}
    if case == "stop":
        kw |= {"stop": ["=", " ap"]}
    for seed in range(8):
        full = client.chat.completions.create(seed=seed, **kw)  # type: ignore[call-overload]
        chunks = list(client.chat.completions.create(seed=seed, stream=True, **kw))  # type: ignore[call-overload]
        text, ids, lps, calls, finish = _collect(chunks)
        c = full.choices[0]
        assert text == (c.message.content or "")
        assert ids == c.model_extra["token_ids"]
        assert lps == [e.logprob for e in c.logprobs.content]
        want = [(t.function.name, t.function.arguments) for t in c.message.tool_calls or []]
        assert calls == want
        assert finish == c.finish_reason
        assert chunks[0].model_extra["prompt_token_ids"] == full.model_extra["prompt_token_ids"]  # type: ignore[index]


async def test_async_client_streaming_and_usage(base_url: str) -> None:
    client = openai.AsyncOpenAI(base_url=base_url, api_key="none")
    stream = await client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "What is the opposite of hot?"}],
        stream=True, stream_options={"include_usage": True}, seed=4)
    chunks = [c async for c in stream]
    assert chunks[-1].usage is not None and chunks[-1].choices == []
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    r = await client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "What is the opposite of hot?"}],
        seed=4)
    assert text == r.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens  # type: ignore[union-attr]
    await client.close()


def test_forced_completion(base_url: str) -> None:
    client = openai.OpenAI(base_url=base_url, api_key="none")
    force = {"text": "Let me check.", "tool_calls": [
        {"name": "calculator", "arguments": json.dumps({"expression": "2 + 2"})}]}
    r = client.chat.completions.create(
        model=MODEL_NAME, messages=_tools_msgs(), tools=md.TOOLS, logprobs=True,  # type: ignore[arg-type]
        extra_body={"tracewire": {"force": force}, "return_token_ids": True})
    c = r.choices[0]
    assert c.message.content == "Let me check."
    assert c.message.tool_calls[0].function.arguments == '{"expression": "2 + 2"}'  # type: ignore[index]
    assert c.finish_reason == "tool_calls"
    assert all(-9999.0 <= e.logprob <= 0 for e in c.logprobs.content)  # type: ignore[union-attr]
    assert len(c.logprobs.content) == len(c.model_extra["token_ids"])  # type: ignore[union-attr,index]
