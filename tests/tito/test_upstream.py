"""TokenUpstream (the proxy's Upstream seam, token-in/token-out) against the loopback fakes
of vLLM completions/generate and SGLang generate: multi-turn tool calling bridges on the
recorded ids, streamed and not; bad replies are 502 and never recorded; a length-cut turn
under the refuse rule is 409."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from tracewire import UpstreamError
from tracewire.proxy._upstream_api import UpstreamRequest
from tracewire.tito import ChatTokenizer, LengthRule, PromptBuilder
from tracewire.tito._token_upstream import TokenUpstream
from tracewire.tito.codecs import UpstreamApi

from .fake_servers import Script, start_fake
from .helpers import TOOLS, completion_text, sample_ids

APIS = [UpstreamApi.COMPLETIONS, UpstreamApi.GENERATE, UpstreamApi.SGLANG]


def _req(msgs: list[dict[str, Any]], stream: bool) -> UpstreamRequest:
    body = {"model": "m", "messages": msgs, "tools": TOOLS, "max_tokens": 256,
            "temperature": 0.5, "stream": stream}
    return UpstreamRequest(orjson.dumps(body), stream=stream, split=False)


async def _stream(up: TokenUpstream, req: UpstreamRequest) -> dict[str, Any]:
    it: AsyncIterator[Any] = up.stream_chat(req)
    content, ids, lps, calls, prompt, finish = "", [], [], [], None, None
    async for ch in it:
        d = ch.data
        assert ch.line.startswith(b"data: ")
        if "prompt_token_ids" in d:
            assert prompt is None
            prompt = d["prompt_token_ids"]
        c = d["choices"][0]
        content += c["delta"].get("content") or ""
        calls += c["delta"].get("tool_calls") or []
        ids += c["token_ids"]
        lps += [e["logprob"] for e in c["logprobs"]["content"]]
        finish = c["finish_reason"] or finish
    msg: dict[str, Any] = {"role": "assistant", "content": content or None}
    if calls:
        msg["tool_calls"] = [{k: v for k, v in tc.items() if k != "index"} for tc in calls]
    return {"prompt": prompt, "ids": ids, "logprobs": lps, "message": msg, "finish": finish}


async def _turn(up: TokenUpstream, msgs: list[dict[str, Any]], stream: bool
                ) -> dict[str, Any]:
    if stream:
        return await _stream(up, _req(msgs, True))
    r = (await up.chat(_req(msgs, False))).data
    c = r["choices"][0]
    return {"prompt": r["prompt_token_ids"], "ids": c["token_ids"],
            "logprobs": [e["logprob"] for e in c["logprobs"]["content"]],
            "message": c["message"], "finish": c["finish_reason"]}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("api", APIS)
async def test_multi_turn(toks: dict[str, ChatTokenizer], family: str, api: UpstreamApi,
                          stream: bool) -> None:
    # A streamed turn over /inference/v1/generate asks the server whole and relays it.
    b = PromptBuilder(toks[family])
    script = Script(ids=[])
    runner, base = await start_fake(script)
    up = TokenUpstream(base, b, api=api, model="m")
    await up.start()
    try:
        msgs: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."},
                                      {"role": "user", "content": "look up 0..5"}]
        prev: list[int] | None = None
        for t in range(6):
            script.ids = sample_ids(b, completion_text(family, t), canonical=t % 2 == 0)
            script.text = b.tok.decode(script.ids)
            out = await _turn(up, msgs, stream)
            sent = script.requests[-1]
            sent_ids = sent.get("prompt") or sent.get("token_ids") or sent.get("input_ids")
            assert out["prompt"] == sent_ids  # what the harness sees = what the model got
            assert out["ids"] == script.ids and len(out["logprobs"]) == len(script.ids)
            if prev is not None:
                assert out["prompt"][:len(prev)] == prev  # sampled ids kept verbatim
            prev = out["prompt"] + out["ids"]
            msg = out["message"]
            assert out["finish"] == "tool_calls" and msg["tool_calls"][0]["function"][
                "name"] == "lookup"
            msgs.append(msg)
            msgs.append({"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"],
                         "content": f"value {t}"})
            if t == 2:  # a new user query: Qwen3's template would drop past <think> here
                msgs.append({"role": "user", "content": "and the rest"})
        assert up.session.bridges == 5 and not up.session.rerenders
        # The same history again (a retry, a group's second sample): the same prompt ids.
        again = await _turn(up, msgs[:2], stream)
        assert again["prompt"] == script.requests[0].get("prompt", script.requests[0].get(
            "token_ids", script.requests[0].get("input_ids")))
    finally:
        await up.close()
        await runner.cleanup()


async def test_bad_reply_is_502_and_not_recorded(toks: dict[str, ChatTokenizer]) -> None:
    b = PromptBuilder(toks["qwen25"])
    script = Script(ids=sample_ids(b, "hello"), short_logprobs=True)
    runner, base = await start_fake(script)
    up = TokenUpstream(base, b)
    await up.start()
    try:
        with pytest.raises(UpstreamError) as ei:
            await up.chat(_req([{"role": "user", "content": "hi"}], False))
        assert getattr(ei.value, "status", None) == 502
        assert len(up.session.index) == 0
    finally:
        await up.close()
        await runner.cleanup()


async def test_length_cut_refused_is_409(toks: dict[str, ChatTokenizer]) -> None:
    b = PromptBuilder(toks["qwen25"], length_rule=LengthRule.REFUSE)
    script = Script(ids=b.tok.encode("cut off mid"), finish="length")
    runner, base = await start_fake(script)
    up = TokenUpstream(base, b)
    await up.start()
    try:
        msgs: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
        out = await _turn(up, msgs, False)
        assert out["finish"] == "length"
        msgs += [out["message"], {"role": "user", "content": "go on"}]
        with pytest.raises(UpstreamError) as ei:
            await up.chat(_req(msgs, False))
        assert getattr(ei.value, "status", None) == 409
    finally:
        await up.close()
        await runner.cleanup()
