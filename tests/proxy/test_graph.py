"""TurnGraph through the proxy with an in-process upstream (MockUpstream, no model server).

The handler renders prompts with a toy chat template (one role token, one token per
character, an end token; the prompt ends with the assistant role token), so prompt ids
extend the recorded path exactly when the harness resends its history unchanged. The
harness side is a real aiohttp client on loopback.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import numpy as np
import orjson
import pytest

from tracewire.proxy import MockCall, MockUpstream, Proxy, Session
from tracewire.samples import SampleBuilder

ROLE = {"system": 1, "user": 2, "assistant": 3, "tool": 4}
END = 5


def chars(text: str) -> list[int]:
    return [100 + ord(c) for c in text]


def render(m: dict[str, Any]) -> list[int]:
    body = m.get("content") or ""
    for tc in m.get("tool_calls") or ():
        body += tc["function"]["name"] + tc["function"]["arguments"]
    return [ROLE[m["role"]], *chars(body), END]


def prompt_of(messages: list[dict[str, Any]]) -> list[int]:
    return [t for m in messages for t in render(m)] + [ROLE["assistant"]]


def completion(prompt: list[int], text: str, *, tool: dict[str, str] | None = None,
               finish: str = "stop") -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": text}
    body = text
    if tool is not None:
        msg["tool_calls"] = [{"id": tool["id"], "type": "function", "function": {
            "name": tool["name"], "arguments": tool["arguments"]}}]
        body += tool["name"] + tool["arguments"]
        finish = "tool_calls"
    ids = [*chars(body), END]
    return {"id": "c", "object": "chat.completion", "model": "toy",
            "prompt_token_ids": prompt,
            "choices": [{"index": 0, "message": msg, "finish_reason": finish,
                         "token_ids": ids,
                         "logprobs": {"content": [{"token": f"token_id:{t}", "logprob": -0.5}
                                                  for t in ids]}}],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids),
                      "total_tokens": len(prompt) + len(ids)}}


def toy(answer: Callable[[list[dict[str, Any]]], str] = lambda ms: f"a{len(ms)}"
        ) -> Callable[[MockCall], Any]:
    def handler(call: MockCall) -> Any:
        msgs = call.body["messages"]
        return completion(prompt_of(msgs), answer(msgs))
    return handler


@pytest.fixture
def mock() -> MockUpstream:
    return MockUpstream(toy())


@pytest.fixture
async def proxy(mock: MockUpstream) -> AsyncIterator[Proxy]:
    async with Proxy(mock) as p:
        yield p


async def chat(s: Session, messages: list[dict[str, Any]], **extra: Any
               ) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {s.secret}", **extra.pop("headers", {})}
    async with aiohttp.ClientSession() as c, c.post(
            s.base_url + "/chat/completions", headers=headers,
            json={"model": "toy", "messages": messages, **extra}) as r:
        return r.status, orjson.loads(await r.read())


SYS = {"role": "system", "content": "be brief"}
USER = {"role": "user", "content": "hi"}


async def _agent(s: Session, turns: int, history: list[dict[str, Any]] | None = None
                 ) -> list[dict[str, Any]]:
    msgs = list(history or [SYS, USER])
    for i in range(turns):
        st, d = await chat(s, msgs)
        assert st == 200, d
        msgs.append(d["choices"][0]["message"])
        msgs.append({"role": "user", "content": f"more {i}"})
    return msgs


async def test_linear_session_is_one_branch_with_the_upstream_ids(
        proxy: Proxy, mock: MockUpstream) -> None:
    s = proxy.create_session()
    msgs = await _agent(s, 3)
    t = s.trace
    assert len(mock.calls) == 3 and len(t.calls) == 3
    assert t.info.get("token_mismatches", 0) == 0
    leaf = t.calls[-1].node
    assert leaf is not None
    want = [*prompt_of(msgs[:-2]), *chars(msgs[-2]["content"]), END]
    assert t.branch(leaf).ids.tolist() == want
    # Every node is on one path: each parent is the node before it.
    assert [n.parent for n in t.nodes] == [None, *range(len(t.nodes) - 1)]
    assert [c.prompt_node for c in t.calls] == [1, 3, 5]


async def test_a_new_message_after_a_shared_prefix_branches(proxy: Proxy) -> None:
    s = proxy.create_session()
    await _agent(s, 2)
    st, _ = await chat(s, [SYS, USER, {"role": "assistant", "content": "a2"},
                           {"role": "user", "content": "other"}])
    assert st == 200
    t = s.trace
    assert t.info.get("token_mismatches", 0) == 0
    first_answer = t.calls[0].node
    kids = [i for i, n in enumerate(t.nodes) if n.parent == first_answer]
    assert len(kids) == 2  # "more 0" and "other" under the same answer
    leaves = {c.node for c in t.calls}
    assert len(leaves) == 3


async def test_sdk_retries_replay_the_committed_answer(proxy: Proxy, mock: MockUpstream
                                                       ) -> None:
    s = proxy.create_session()
    st, first = await chat(s, [SYS, USER])
    st2, again = await chat(s, [SYS, USER], headers={"x-stainless-retry-count": "1"})
    assert st == st2 == 200 and again == first
    st3, _ = await chat(s, [SYS, USER], headers={"Idempotency-Key": "k1"})
    st4, _ = await chat(s, [SYS, USER], headers={"Idempotency-Key": "k1"})
    assert st3 == st4 == 200
    # One upstream call for the first request, one for the first Idempotency-Key use.
    assert len(mock.calls) == 2 and len(s.trace.calls) == 2


async def test_retokenized_history_is_a_mismatch_and_reroots(mock: MockUpstream) -> None:
    def handler(call: MockCall) -> Any:
        msgs = call.body["messages"]
        p = prompt_of(msgs)
        if len(msgs) > 2:
            p[len(render(SYS)) + len(render(USER)) + 1] += 1  # the answer re-rendered
        return completion(p, "x")

    mock.handler = handler
    async with Proxy(mock) as proxy:
        s = proxy.create_session()
        await _agent(s, 2)
    t = s.trace
    assert t.info["token_mismatches"] == 1
    assert t.info.get("history_rewrites", 0) == 0
    roots = [i for i, n in enumerate(t.nodes) if n.parent is None]
    assert len(roots) == 2


async def test_a_dropped_answer_branches_below_the_shared_prefix(proxy: Proxy) -> None:
    # mini-swe-agent drops an unusable answer and sends a user message instead.
    s = proxy.create_session()
    st, _ = await chat(s, [SYS, USER])
    assert st == 200
    st, _ = await chat(s, [SYS, USER, {"role": "user", "content": "format error"}])
    assert st == 200
    t = s.trace
    assert t.info.get("token_mismatches", 0) == 0
    assert t.info["history_rewrites"] == 1
    roots = [i for i, n in enumerate(t.nodes) if n.parent is None]
    assert roots == [0]  # not copied into a new root: it branches under the system node
    leaf = t.calls[-1].node
    assert leaf is not None
    want = prompt_of([SYS, USER, {"role": "user", "content": "format error"}])
    assert t.branch(leaf).ids.tolist()[:len(want)] == want
    samples = SampleBuilder(t).attach().samples()
    assert {smp.status for smp in samples} == {"completed"}


async def test_a_failed_call_after_good_turns_is_counted_and_aborts(mock: MockUpstream
                                                                     ) -> None:
    good = toy()

    def handler(call: MockCall) -> Any:
        if len(call.body["messages"]) > 4:
            return 500, {"error": {"message": "engine died"}}
        return good(call)

    mock.handler = handler
    async with Proxy(mock) as proxy:
        s = proxy.create_session()
        msgs = await _agent(s, 2)
        st, d = await chat(s, msgs)
    assert st == 502 and "engine died" in d["error"]["message"]
    t = s.trace
    failed = t.calls[-1]
    assert failed.error == "engine died" and failed.node is None
    assert failed.prompt_node == t.calls[-2].node
    b = SampleBuilder(t).attach()
    assert b.summary()["failed_calls"] == 1
    assert [smp.status for smp in b.samples()] == ["aborted"]


async def test_a_stream_cut_short_is_counted_and_aborts(mock: MockUpstream) -> None:
    good = toy()

    def handler(call: MockCall) -> Any:
        d = good(call)
        if call.stream and len(call.body["messages"]) > 2:
            d["choices"][0]["finish_reason"] = None  # the stream ends mid-answer
        return d

    mock.handler = handler
    async with Proxy(mock) as proxy:
        s = proxy.create_session()
        st, d = await chat(s, [SYS, USER])
        assert st == 200
        msgs = [SYS, USER, d["choices"][0]["message"], {"role": "user", "content": "go"}]
        async with aiohttp.ClientSession() as c, c.post(
                s.base_url + "/chat/completions",
                headers={"Authorization": f"Bearer {s.secret}"},
                json={"model": "toy", "messages": msgs, "stream": True}) as r:
            text = (await r.read()).decode()
    assert "stream ended before the answer finished" in text
    b = SampleBuilder(s.trace).attach()
    assert b.summary()["failed_calls"] == 1
    assert [smp.status for smp in b.samples()] == ["aborted"]


async def test_tool_call_texts_are_kept_per_session(mock: MockUpstream) -> None:
    args = '{"a": 1,  "b": [2]}'

    def handler(call: MockCall) -> Any:
        p = prompt_of(call.body["messages"])
        return completion(p, "", tool={"id": "call_7", "name": "add", "arguments": args})

    mock.handler = handler
    async with Proxy(mock) as proxy:
        s = proxy.create_session()
        st, _ = await chat(s, [SYS, USER])
    assert st == 200
    assert s.tool_args == {"call_7": args}


async def test_streamed_anthropic_answers_report_usage(mock: MockUpstream) -> None:
    good = toy()
    asked: list[Any] = []

    def handler(call: MockCall) -> Any:
        asked.append(call.body.get("stream_options"))
        d = good(call)
        chunks: list[dict[str, Any]] = two_chunks(d)
        if (call.body.get("stream_options") or {}).get("include_usage"):
            chunks.append({"object": "chat.completion.chunk", "choices": [],
                           "usage": d["usage"]})
        return chunks

    mock.handler = handler
    async with Proxy(mock) as proxy:
        s = proxy.create_session()
        async with aiohttp.ClientSession() as c, c.post(
                s.anthropic_base_url + "/v1/messages",
                headers={"x-api-key": s.secret, "anthropic-version": "2023-06-01"},
                json={"model": "toy", "max_tokens": 20, "stream": True,
                      "messages": [{"role": "user", "content": "hi"}]}) as r:
            assert r.status == 200
            text = (await r.read()).decode()
    assert asked == [{"include_usage": True}]
    usage = s.trace.calls[0].usage
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
    events = [orjson.loads(line[6:]) for line in text.splitlines()
              if line.startswith("data: ")]
    delta = next(e for e in events if e.get("type") == "message_delta")
    assert delta["usage"]["output_tokens"] == usage["completion_tokens"]


def two_chunks(d: dict[str, Any]) -> list[dict[str, Any]]:
    """The completion as one content chunk and one finishing chunk, without usage."""
    ch = d["choices"][0]
    head = {k: v for k, v in d.items() if k not in ("choices", "usage")}
    return [{**head, "object": "chat.completion.chunk", "choices": [
                {"index": 0, "delta": ch["message"], "token_ids": ch["token_ids"],
                 "logprobs": ch["logprobs"], "finish_reason": None}]},
            {**head, "object": "chat.completion.chunk", "choices": [
                {"index": 0, "delta": {}, "finish_reason": ch["finish_reason"]}]}]


def test_toy_template_extends_itself() -> None:
    # The premise of these tests: resending history unchanged extends the last prompt.
    p1 = prompt_of([SYS, USER])
    ans = completion(p1, "ok")["choices"][0]
    p2 = prompt_of([SYS, USER, ans["message"], {"role": "user", "content": "x"}])
    assert p2[:len(p1) + len(ans["token_ids"])] == p1 + ans["token_ids"]
    assert np.array_equal(np.array(p1), np.array(p2[:len(p1)]))


async def test_models_and_count_tokens_go_through_the_upstream() -> None:
    def handler(call: MockCall) -> Any:
        if call.path == "/models":
            return {"object": "list", "data": [{"id": "toy", "object": "model"}]}
        if call.path == "/tokenize":
            return {"count": len(prompt_of(call.body["messages"]))}
        return 500, {"error": {"message": "not used"}}

    mock = MockUpstream(handler)
    async with Proxy(mock) as proxy:
        s = proxy.create_session()
        headers = {"x-api-key": s.secret, "anthropic-version": "2023-06-01"}
        async with aiohttp.ClientSession() as c:
            async with c.get(s.base_url + "/models", headers=headers) as r:
                assert r.status == 200 and (await r.json())["data"][0]["id"] == "toy"
            async with c.post(s.anthropic_base_url + "/v1/messages/count_tokens",
                              headers=headers, json={"model": "toy", "messages": [
                                  {"role": "user", "content": "hi"}]}) as r:
                assert r.status == 200
                want = len(prompt_of([{"role": "user", "content": "hi"}]))
                assert (await r.json()) == {"input_tokens": want}
    assert [c.path for c in mock.calls] == ["/models", "/tokenize"]
