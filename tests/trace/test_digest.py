"""One canonical message digest (trace) for the proxy and token-in/token-out.

The two functions it replaced are copied here, only here, as the reference: the proxy's
digest is stored on disk (``Node.digest``), so the new one must give the same bytes; the
token-in/token-out one was only ever held in memory, and the new one must call the same
messages the same turn.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

import openai
import orjson

from tracewire.proxy import MockCall, MockUpstream, Proxy
from tracewire.trace import Message, ToolCall, chat_message_digest, message_digest

# -- the replaced implementations (proxy/_graph.py and tito/_history.py before the move) ---


def _old_canon_content(content: Any) -> Any:
    if content is None:
        return ""
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") in ("text", "input_text", "output_text")
        for p in content
    ):
        return "".join(str(p.get("text", "")) for p in content)
    return content


def _old_canon_args(arguments: str) -> str:
    try:
        return orjson.dumps(orjson.loads(arguments), option=orjson.OPT_SORT_KEYS).decode()
    except orjson.JSONDecodeError:
        return arguments


def old_proxy_digest(msg: Message) -> str:
    tcs = [(t.id, t.name, _old_canon_args(t.arguments)) for t in msg.tool_calls or ()]
    canon = (msg.role, _old_canon_content(msg.content), tcs, msg.tool_call_id or "",
             msg.name or "")
    data = orjson.dumps(canon, option=orjson.OPT_SORT_KEYS)
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def _old_decoded_arguments(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return arguments
    return arguments


def old_tito_digest(m: dict[str, Any]) -> bytes:
    tcs = []
    for tc in m.get("tool_calls") or ():
        fn = tc.get("function") or {}
        tcs.append((str(tc.get("id") or ""), str(fn.get("name") or ""),
                    _old_decoded_arguments(fn.get("arguments", ""))))
    canon = (m.get("role"), _old_canon_content(m.get("content")), tcs,
             m.get("tool_call_id") or "", m.get("name") or "")
    data = orjson.dumps(canon, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
    return hashlib.blake2b(data, digest_size=16).digest()


# -- a corpus of chat messages ---------------------------------------------------------------

_CONTENTS: list[Any] = [
    None, "", "hi", "héllo ✓ 日本", "a\nb\t\"q\"", "x" * 300,
    [{"type": "text", "text": "part one "}, {"type": "text", "text": "two"}],
    [{"type": "input_text", "text": "in"}], [{"type": "output_text", "text": "out"}],
    [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "data:,"}}],
    [{"type": "text"}], [],
]
_ARGS = ['{"a": 1, "b": [1, 2]}', '{"b":[1,2],"a":1}', '{"q": "日本", "n": null}', "",
         "not json", '  {"a":1}  ', "[1, 2]", "3", '{"nested": {"z": 1, "y": {"x": true}}}']


def _corpus(n: int = 1500, seed: int = 7) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    for i in range(n):
        role = rng.choice(["system", "user", "assistant", "tool"])
        m: dict[str, Any] = {"role": role, "content": rng.choice(_CONTENTS)}
        if role == "assistant" and rng.random() < 0.5:
            m["tool_calls"] = [
                {"id": rng.choice(["", f"call_{i % 5}"]), "type": "function",
                 "function": {"name": rng.choice(["f", "search", ""]),
                              "arguments": rng.choice(_ARGS)}}
                for _ in range(rng.randint(1, 3))]
        if role == "tool":
            m["tool_call_id"] = rng.choice(["", "call_1", None])
        if rng.random() < 0.2:
            m["name"] = rng.choice(["bob", "", None])
        if rng.random() < 0.3:
            m["reasoning"] = rng.choice(["think", "other thought"])
        out.append(m)
    return out


def _message(m: dict[str, Any]) -> Message:
    tcs = [ToolCall(id=str(tc["id"] or ""), name=str(tc["function"]["name"] or ""),
                    arguments=tc["function"]["arguments"]) for tc in m.get("tool_calls") or ()]
    return Message(role=m["role"], content=m.get("content"), tool_calls=tcs or None,
                   tool_call_id=m.get("tool_call_id"), name=m.get("name"),
                   reasoning=m.get("reasoning"))


def test_the_stored_digest_is_byte_identical_to_the_proxys_old_one() -> None:
    corpus = _corpus()
    for m in corpus:
        msg = _message(m)
        assert message_digest(msg) == old_proxy_digest(msg), m
        # The dict entry point is the same digest, raw.
        assert chat_message_digest(m) == bytes.fromhex(message_digest(msg)), m
    assert len({message_digest(_message(m)) for m in corpus}) > 200  # not one constant


def _groups(keys: list[Any]) -> set[frozenset[int]]:
    by: dict[Any, set[int]] = {}
    for i, k in enumerate(keys):
        by.setdefault(k, set()).add(i)
    return {frozenset(v) for v in by.values()}


def test_tito_calls_the_same_messages_the_same_turn_as_before() -> None:
    # Token-in/token-out only compares digests in memory: the new digest must group a
    # corpus exactly as the old one did (its arguments also arrive as objects).
    corpus = _corpus()
    for m in corpus[::3]:
        for tc in m.get("tool_calls") or ():
            args = tc["function"]["arguments"]
            if args.strip().startswith("{"):
                tc["function"]["arguments"] = orjson.loads(args)
    assert _groups([old_tito_digest(m) for m in corpus]) == \
        _groups([chat_message_digest(m) for m in corpus])


def test_what_changes_a_turn_and_what_does_not() -> None:
    base = {"role": "assistant", "content": "x",
            "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": '{"a":1,"b":2}'}}]}
    same = [
        {**base, "reasoning": "dropped on resend"},
        {**base, "content": [{"type": "text", "text": "x"}]},
        {**base, "tool_calls": [{"id": "c", "function": {"name": "f",
                                                          "arguments": {"b": 2, "a": 1}}}]},
        {**base, "tool_call_id": None, "name": ""},
    ]
    other = [{**base, "role": "user"}, {**base, "content": "y"}, {**base, "name": "n"},
             {**base, "tool_calls": [{"id": "d", "function": {"name": "f", "arguments": "{}"}}]}]
    d = chat_message_digest(base)
    assert all(chat_message_digest(m) == d for m in same)
    assert all(chat_message_digest(m) != d for m in other)
    assert len({chat_message_digest(m) for m in other}) == len(other)


def _answer(call: MockCall) -> dict[str, Any]:
    # First turn: a tool call; later turns: text. No token ids (a hosted API's shape).
    first = len(call.body["messages"]) == 2
    msg: dict[str, Any] = {"role": "assistant", "content": "" if first else "done"}
    if first:
        msg["tool_calls"] = [{"id": "c1", "type": "function",
                              "function": {"name": "add", "arguments": '{"b": 2, "a": 1}'}}]
    return {"id": "x", "object": "chat.completion", "model": "m",
            "choices": [{"index": 0, "message": msg,
                         "finish_reason": "tool_calls" if first else "stop"}]}


async def test_the_proxy_stores_the_canonical_digest_and_matches_reserialized_args() -> None:
    # Through a real proxy and the openai SDK: the resent tool call (arguments
    # re-serialized, as a dialect translation does) matches the recorded node, and every
    # node carries the digest the old proxy stored.
    upstream = MockUpstream(_answer)
    async with Proxy(upstream) as proxy:
        s = proxy.create_session()
        client = openai.AsyncOpenAI(base_url=s.base_url, api_key=s.secret)
        msgs: list[Any] = [{"role": "system", "content": "be brief"},
                           {"role": "user", "content": [{"type": "text", "text": "1+2?"}]}]
        await client.chat.completions.create(model="m", messages=msgs)
        msgs += [{"role": "assistant", "content": "", "tool_calls": [
                     {"id": "c1", "type": "function",
                      "function": {"name": "add", "arguments": '{"a":1,"b":2}'}}]},
                 {"role": "tool", "tool_call_id": "c1", "content": "3"}]
        await client.chat.completions.create(model="m", messages=msgs)
        nodes = s.trace.nodes
        await client.close()
    assert [n.message.role for n in nodes] == ["system", "user", "assistant", "tool",
                                               "assistant"]
    assert [n.parent for n in nodes] == [None, 0, 1, 2, 3]  # one branch: the resend matched
    for node in nodes:
        assert node.digest == old_proxy_digest(node.message) == message_digest(node.message)


def test_the_one_case_tito_now_tells_apart() -> None:
    # Old tito compared arguments as decoded values, so JSON text '"x"' (a JSON string)
    # and the bare text 'x' were one turn; the stored (proxy) digest always told them
    # apart, and tito now agrees with it. Nothing else in the corpus above changed group.
    def call(args: str) -> dict[str, Any]:
        return {"role": "assistant", "content": "",
                "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": args}}]}

    assert old_tito_digest(call('"x"')) == old_tito_digest(call("x"))
    assert chat_message_digest(call('"x"')) != chat_message_digest(call("x"))
