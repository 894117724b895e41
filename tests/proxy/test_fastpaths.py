"""The O(new) fast paths: a resent messages prefix is skipped by bytes, and the upstream's
prompt ids are read as the cached prompt's text plus a parsed tail. Each must fall back
(and still detect edits and re-tokenization mismatches) when the bytes do not line up."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aiohttp
import orjson
import pytest

from tracewire.proxy import Proxy
from tracewire.proxy._prompt import PromptCache, parse_tail
from tracewire.proxy._prompt_cut import loads_split
from tracewire.proxy._rawjson import RawSpan, cut_array

from .fake_upstream import Fake, Turn
from .helpers import check_linear


class Harness:
    """Posts raw chat bodies for one session and keeps the messages as the harness would."""

    def __init__(self, proxy: Proxy) -> None:
        self.session = proxy.create_session()
        self.url = self.session.base_url + "/chat/completions"
        self.headers = {"Authorization": f"Bearer {self.session.secret}",
                        "Content-Type": "application/json"}

    async def post(self, body: bytes) -> dict[str, Any]:
        async with aiohttp.ClientSession() as c, c.post(
                self.url, data=body, headers=self.headers) as r:
            assert r.status == 200, await r.text()
            out: dict[str, Any] = orjson.loads(await r.read())
            return out

    async def turn(self, messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        d = await self.post(orjson.dumps({"model": "m", "messages": messages, **extra}))
        msg: dict[str, Any] = d["choices"][0]["message"]
        return {k: v for k, v in msg.items() if v is not None}


def _tamper(fake: Fake, edit: Callable[[list[int]], list[int]]) -> None:
    """Make the fake report an edited prompt from now on (a re-tokenizing upstream)."""
    orig = fake.answer

    def answer(req: dict[str, Any]) -> Turn:
        t = orig(req)
        t.prompt = edit(t.prompt)
        return t

    fake.answer = answer  # type: ignore[method-assign]


def _roots(proxy_trace: Any) -> list[int]:
    return [i for i, n in enumerate(proxy_trace.nodes) if n.parent is None]


async def test_long_linear_session_stays_token_exact(fake: Fake, proxy: Proxy) -> None:
    h = Harness(proxy)
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "sys"}]
    for k in range(12):
        msgs.append({"role": "user", "content": f"turn {k} " + "x" * k})
        msgs.append(await h.turn(msgs))
    log = fake.log
    check_linear(h.session.trace, [t.prompt for t in log], [t.completion for t in log],
                 [t.logprobs for t in log])
    assert len(_roots(h.session.trace)) == 1


async def test_a_resent_plain_answer_is_matched_by_its_bytes(
        fake: Fake, proxy: Proxy, monkeypatch: pytest.MonkeyPatch) -> None:
    # The commit indexes a plain-text answer's compact {"role", "content"} bytes (how orjson
    # and the openai SDK write a dict of the two): resent so, it is matched undecoded.
    from tracewire.proxy import _request

    decoded: list[bytes] = []
    real = _request.checked_message

    def spy(d: Any, where: str) -> Any:
        decoded.append(bytes(d))
        return real(d, where)

    monkeypatch.setattr(_request, "checked_message", spy)
    h = Harness(proxy)
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "first"}]
    a = await h.turn(msgs)
    msgs += [{"role": "assistant", "content": a["content"]}, {"role": "user", "content": "2nd"}]
    decoded.clear()
    await h.turn(msgs)
    assert [orjson.loads(d)["role"] for d in decoded] == ["user"]
    t = h.session.trace
    assert [(n.message.role, n.sampled) for n in t.nodes] == [
        ("user", False), ("assistant", True), ("user", False), ("assistant", True)]
    # The same form with other text is not that answer: decoded, and a node of its own.
    edited = [msgs[0], {"role": "assistant", "content": a["content"] + "!"},
              {"role": "user", "content": "3rd"}]
    decoded.clear()
    await h.turn(edited)
    assert [orjson.loads(d)["role"] for d in decoded] == ["assistant", "user"]
    leaf = t.calls[-1].node
    assert leaf is not None
    path = [t.nodes[i] for i in t.path(leaf)]
    assert [(n.message.content, n.sampled) for n in path[:3]] == [
        ("first", False), (a["content"] + "!", False), ("3rd", False)]
    assert t.branch(leaf).ids.tolist() == fake.log[-1].prompt + fake.log[-1].completion


async def test_edited_earlier_message_is_not_skipped(fake: Fake, proxy: Proxy) -> None:
    h = Harness(proxy)
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "first"}]
    msgs.append(await h.turn(msgs))
    msgs.append({"role": "user", "content": "second"})
    msgs.append(await h.turn(msgs))
    # Same length, one byte different, in the first message of the cached prefix.
    edited = [{"role": "user", "content": "firsT"}, *msgs[1:],
              {"role": "user", "content": "third"}]
    await h.turn(edited)
    t = h.session.trace
    assert len(_roots(t)) == 2
    leaf = t.calls[-1].node
    assert leaf is not None
    assert [t.nodes[i].message.content for i in t.path(leaf)][:1] == ["firsT"]
    assert t.branch(leaf).ids.tolist() == fake.log[-1].prompt + fake.log[-1].completion
    assert t.info.get("token_mismatches", 0) == 0


async def test_edited_last_message_of_prefix_is_not_skipped(fake: Fake, proxy: Proxy) -> None:
    h = Harness(proxy)
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "ab"}]
    a1 = await h.turn(msgs)
    # The previous request's last message, longer: the old text is a byte prefix of the
    # new one only up to inside that message.
    await h.turn([{"role": "user", "content": "abc"}, a1, {"role": "user", "content": "z"}])
    t = h.session.trace
    assert len(_roots(t)) == 2
    leaf = t.calls[-1].node
    assert leaf is not None
    assert t.branch(leaf).ids.tolist() == fake.log[-1].prompt + fake.log[-1].completion


async def test_retokenized_completion_is_a_mismatch(fake: Fake, proxy: Proxy) -> None:
    h = Harness(proxy)
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "hello"}]
    msgs.append(await h.turn(msgs))
    p1 = len(fake.log[0].prompt)
    # The new prompt starts with the cached prompt's text, but the upstream renders the
    # sampled completion differently: the tail does not match the path's completion.
    _tamper(fake, lambda p: [*p[:p1], 999, *p[p1 + 1:]])
    msgs.append({"role": "user", "content": "again"})
    await h.turn(msgs)
    t = h.session.trace
    assert t.info["token_mismatches"] == 1
    leaf = t.calls[-1].node
    assert leaf is not None and t.path(leaf)[0] != 0
    assert t.branch(leaf).ids.tolist() == fake.log[-1].prompt + fake.log[-1].completion


async def test_prompt_continuing_the_last_cached_id_is_a_mismatch(fake: Fake, proxy: Proxy
                                                                  ) -> None:
    h = Harness(proxy)
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "hello"}]
    msgs.append(await h.turn(msgs))
    p1 = len(fake.log[0].prompt)
    # "[..., 12" is a text prefix of "[..., 1234, ...": not a boundary between ids.
    _tamper(fake, lambda p: [*p[:p1 - 1], p[p1 - 1] * 100 + 34, *p[p1:]])
    msgs.append({"role": "user", "content": "again"})
    await h.turn(msgs)
    t = h.session.trace
    assert t.info["token_mismatches"] == 1
    leaf = t.calls[-1].node
    assert leaf is not None
    assert t.branch(leaf).ids.tolist() == fake.log[-1].prompt + fake.log[-1].completion


async def test_messages_key_nested_before_the_real_one(fake: Fake, proxy: Proxy) -> None:
    h = Harness(proxy)
    tools = [{"type": "function", "function": {"name": "send", "parameters": {
        "type": "object", "properties": {"messages": {"type": "array"}}}}}]
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
    sent = []
    for _ in range(4):
        # "tools" first: the first '"messages":' in the body is the nested one.
        sent.append(list(msgs))
        d = await h.post(orjson.dumps({"tools": tools, "messages": msgs, "model": "m"}))
        msg = {k: v for k, v in d["choices"][0]["message"].items() if v is not None}
        msgs += [msg, *[{"role": "tool", "tool_call_id": c["id"], "content": "ok"}
                        for c in msg.get("tool_calls") or ()]]
        if not msg.get("tool_calls"):
            msgs.append({"role": "user", "content": "more"})
    log = fake.log
    check_linear(h.session.trace, [t.prompt for t in log], [t.completion for t in log],
                 [t.logprobs for t in log])
    assert [r["messages"] for r in fake.requests] == sent
    assert all(r["tools"] == tools for r in fake.requests)


async def test_prompt_ids_spliced_back_when_asked(fake: Fake, proxy: Proxy) -> None:
    h = Harness(proxy)
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
    for k in range(3):
        d = await h.post(orjson.dumps({"messages": msgs, "return_token_ids": True}))
        assert d["prompt_token_ids"] == fake.log[-1].prompt
        assert d["choices"][0]["token_ids"] == fake.log[-1].completion
        assert d["choices"][0]["logprobs"] is None
        msgs += [{"role": "assistant", "content": d["choices"][0]["message"]["content"]},
                 {"role": "user", "content": f"u{k}"}]
    # Streamed: the chunk carrying the prompt ids is relayed with them, logprobs nulled.
    body = orjson.dumps({"messages": msgs, "return_token_ids": True, "stream": True})
    prompts = []
    async with aiohttp.ClientSession() as c, c.post(h.url, data=body, headers=h.headers) as r:
        async for line in r.content:
            if line.startswith(b"data: {"):
                chunk = orjson.loads(line[6:])
                if "prompt_token_ids" in chunk:
                    prompts.append(chunk["prompt_token_ids"])
                assert all(ch.get("logprobs") is None for ch in chunk["choices"])
    assert prompts == [fake.log[-1].prompt]
    check_linear(h.session.trace, [t.prompt for t in fake.log],
                 [t.completion for t in fake.log], [t.logprobs for t in fake.log])


def test_cut_array_falls_back_on_a_nested_key() -> None:
    nested = orjson.dumps({"choices": [{"prompt_token_ids": [9, 9]}],
                           "prompt_token_ids": [1, 2, 3]})
    d, span = loads_split(nested)
    assert span is None and d["prompt_token_ids"] == [1, 2, 3]
    top = b'{"choices": [], "prompt_token_ids" : [1, 2, 3] , "x": 1}'
    d, span = loads_split(top)
    assert span is not None and orjson.loads(span.view()) == [1, 2, 3] and d["x"] == 1
    assert cut_array(b'{"prompt_token_ids": null}', b"prompt_token_ids") is None
    d, span = loads_split(b'{"prompt_token_ids": [[1, 2], [3]], "choices": []}')
    assert span is None and d["prompt_token_ids"] == [[1, 2], [3]]


def test_parse_tail_needs_an_id_boundary() -> None:
    old = b'{"prompt_token_ids": [1, 2, 12]}'
    span = RawSpan(old, old.index(b"["), old.index(b"]") + 1)
    cache = PromptCache(span, span.content_end(), node=0, n=3)

    def tail_of(text: bytes) -> list[int] | None:
        s = RawSpan(text, text.index(b"["), text.rindex(b"]") + 1)
        p = parse_tail(s, cache)
        return None if p is None else p.tail.tolist()

    assert tail_of(b'[1, 2, 12, 7, 8]') == [7, 8]
    assert tail_of(b'[1, 2, 12 ]') == []
    assert tail_of(b'[1, 2, 123, 7]') is None  # 12 continues: not the cached ids
    assert tail_of(b'[1, 2, 1234, 5]') is None
    assert tail_of(b'[1, 2, 123]') is None
    assert tail_of(b'[1, 2, 13, 7]') is None
    assert tail_of(b'[1, 2]') is None
    assert tail_of(b'[1, 2, 12, "x"]') is None


def test_upstream_body_is_the_harness_bytes_plus_token_fields() -> None:
    from tracewire.proxy._dialect import parse_chat_bytes

    fields = {"return_token_ids": True, "logprobs": True}
    body = b'{"model":"m", "messages":[{"role":"user","content":"a } b"}],"seed":3}\n'
    out = parse_chat_bytes(body).upstream_bytes(fields)
    assert out.startswith(body.rstrip()[:-1]) and orjson.loads(out) == {
        **orjson.loads(body), **fields}
    assert parse_chat_bytes(body).upstream_bytes({}) == body  # hosted APIs: as received
    # a harness that sets a token field itself: the proxy's value wins, re-encoded
    own = b'{"messages":[{"role":"user","content":"x"}],"logprobs":false}'
    assert orjson.loads(parse_chat_bytes(own).upstream_bytes(fields))["logprobs"] is True
