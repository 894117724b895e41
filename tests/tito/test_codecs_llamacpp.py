"""The llamacpp codec (llama-server's native ``/completion``) on the shapes the real server
answers (taken from llama-server b11434; tests/realmodel checks them against the binary), and
TokenUpstream over a loopback fake of it (a mock here: the real engine runs in the
real-model lane).
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from tracewire import UpstreamError
from tracewire.compose import make_upstream
from tracewire.proxy import Proxy
from tracewire.proxy._upstream_api import UpstreamRequest
from tracewire.tito import ChatTokenizer, PromptBuilder, UpstreamShapeError
from tracewire.tito._token_upstream import TokenUpstream
from tracewire.tito.codecs import (
    SamplingParams,
    StreamDecoder,
    UpstreamApi,
    check_ids,
    decode_response,
    encode_request,
    refusal,
)

L = UpstreamApi.LLAMACPP


def _entry(tid: int, p: float) -> dict[str, Any]:
    return {"id": tid, "token": "x", "bytes": [120], "prob": p,
            "top_probs": [{"id": tid, "token": "x", "bytes": [120], "prob": p}]}


def _reply(ids: list[int], probs: list[tuple[int, float]], stop_type: str = "eos"
           ) -> dict[str, Any]:
    return {"index": 0, "content": "x", "tokens": ids, "id_slot": 0, "stop": True,
            "tokens_predicted": len(ids), "tokens_evaluated": 7, "stop_type": stop_type,
            "truncated": False, "timings": {"predicted_n": len(ids), "predicted_ms": 3.5},
            "completion_probabilities": [_entry(t, p) for t, p in probs]}


def test_request_names_every_sampler_and_asks_post_sampling_probs() -> None:
    p = SamplingParams(max_tokens=9, temperature=0.7, top_p=0.9, top_logprobs=0,
                       extra={"top_k": 20, "seed": 3, "repetition_penalty": 1.2})
    b = encode_request(L, [1, 2, 3], p, stream=True)
    assert b["prompt"] == [1, 2, 3] and b["n_predict"] == 9 and b["stream"] is True
    assert b["post_sampling_probs"] is True and b["n_probs"] == 1
    assert b["return_tokens"] is True and b["cache_prompt"] is True
    assert b["temperature"] == 0.7 and b["top_p"] == 0.9 and b["top_k"] == 20
    assert b["seed"] == 3 and b["repeat_penalty"] == 1.2
    # Server defaults that would truncate silently are sent neutral.
    assert b["min_p"] == 0.0 and b["typical_p"] == 1.0 and b["xtc_probability"] == 0.0
    assert b["mirostat"] == 0 and b["dry_multiplier"] == 0.0
    # Only the samplers asked for, temperature first (vLLM's order).
    assert b["samplers"] == ["penalties", "temperature", "top_k", "top_p"]


def test_plain_request_has_a_temperature_only_chain() -> None:
    b = encode_request(L, [1], SamplingParams(max_tokens=4, extra={"top_k": -1}))
    assert b["samplers"] == ["temperature"] and b["top_k"] == 0 and b["top_p"] == 1.0


@pytest.mark.parametrize(("body", "refused"), [
    ({"mirostat": 2}, "mirostat"), ({"mirostat": 0}, None),
    ({"xtc_probability": 0.5}, "xtc_probability"), ({"xtc_probability": 0.0}, None),
    ({"grammar": "root ::= \"a\""}, "grammar"), ({"grammar": ""}, None),
    ({"json_schema": {"type": "object"}}, "json_schema"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"response_format": {"type": "text"}}, None),
    ({"adaptive_target": 0.5}, "adaptive_target"), ({"adaptive_target": -1}, None),
    ({"samplers": ["top_k"]}, "samplers"),
    ({"temperature": 0.7, "top_k": 5, "presence_penalty": 0.5}, None),
])
def test_refusal(body: dict[str, Any], refused: str | None) -> None:
    why = refusal(L, body)
    assert (why is None) if refused is None else (why is not None and why.startswith(refused))
    assert refusal(UpstreamApi.COMPLETIONS, body) is None


def test_decode_records_log_prob_and_the_close_token() -> None:
    g = decode_response(L, _reply([5, 6, 2], [(5, 0.5), (6, 0.25), (2, 1.0)]))
    assert g.ids == [5, 6, 2] and g.finish_reason == "stop" and g.ended_by_stop
    assert g.logprobs == [math.log(0.5), math.log(0.25), 0.0]
    assert g.usage == {"completion_tokens": 3, "prompt_tokens": 7, "total_tokens": 10}
    assert g.timings["predicted_ms"] == 3.5
    cut = decode_response(L, _reply([5, 6], [(5, 0.5), (6, 0.25)], "limit"))
    assert cut.finish_reason == "length" and not cut.ended_by_stop


def test_withheld_token_gets_nan_never_an_invented_logprob() -> None:
    # llama-server keeps a token ending mid-character out of completion_probabilities.
    g = decode_response(L, _reply([11567, 23274, 115, 12831],
                                  [(11567, 0.9), (115, 0.5), (12831, 0.8)], "limit"))
    assert g.ids == [11567, 23274, 115, 12831]
    assert math.isnan(g.logprobs[1])
    assert g.logprobs[0] == math.log(0.9) and g.logprobs[2] == math.log(0.5)


@pytest.mark.parametrize("bad", [
    _reply([5, 6], [(5, 0.5), (7, 0.5)]),           # an entry for an id not sampled
    _reply([5], [(5, 0.0)]),                         # zero probability for a sampled token
    {"tokens": [5], "content": "x"},                 # probabilities missing
    {"content": "x"},                                # return_tokens not honoured
    {"error": {"code": 400, "message": "Prompt contains invalid tokens"}},
])
def test_bad_replies_are_shape_errors(bad: dict[str, Any]) -> None:
    with pytest.raises(UpstreamShapeError):
        decode_response(L, bad)


def test_stop_id_the_server_does_not_know_cuts_the_completion() -> None:
    g = decode_response(L, _reply([5, 9, 6, 2], [(5, .5), (9, .5), (6, .5), (2, .5)]),
                        stop_ids=(9,))
    assert g.ids == [5, 9] and g.finish_reason == "stop" and len(g.logprobs) == 2


def _chunk(tid: int, p: float, n: int) -> dict[str, Any]:
    return {"index": 0, "content": "x", "tokens": [tid], "stop": False, "id_slot": -1,
            "tokens_predicted": n, "tokens_evaluated": 7,
            "completion_probabilities": [_entry(tid, p)]}


_LAST = {"index": 0, "content": "", "tokens": [], "stop": True, "stop_type": "eos",
         "tokens_predicted": 2, "tokens_evaluated": 7, "timings": {"predicted_n": 2}}


def test_stream_folds_one_chunk_per_token() -> None:
    dec = StreamDecoder(L)
    assert dec.feed(_chunk(5, 0.5, 1)).ids == [5]
    assert dec.feed(_chunk(2, 1.0, 2)).ids == [2] and not dec.done
    last = dec.feed(_LAST)
    assert dec.done and last.finish_reason == "stop"
    g = dec.finish()
    assert g.ids == [5, 2] and g.logprobs == [math.log(0.5), 0.0]
    assert g.usage["prompt_tokens"] == 7


def test_stream_that_withheld_an_id_is_refused() -> None:
    dec = StreamDecoder(L)
    dec.feed(_chunk(5, 0.5, 1))
    with pytest.raises(UpstreamShapeError, match="withheld 1 token id"):
        dec.feed(_chunk(115, 0.5, 3))


def test_stream_stops_at_a_stop_id_and_drops_what_follows() -> None:
    dec = StreamDecoder(L, stop_ids=(9,))
    dec.feed(_chunk(5, 0.5, 1))
    assert dec.feed(_chunk(9, 0.5, 2)).finish_reason == "stop" and not dec.done
    assert dec.feed(_chunk(6, 0.5, 3)).ids == [] and dec.done
    assert dec.finish().ids == [5, 9]


@pytest.mark.parametrize("ids", [[True], [1.0], [[1]], [2**70], [-3], [2**31]])
def test_check_ids_refuses_what_is_not_an_int32_id(ids: list[Any]) -> None:
    with pytest.raises(UpstreamShapeError):
        check_ids(ids)


def test_check_ids_bounds_by_vocabulary_and_length() -> None:
    check_ids([0, 511], vocab_size=512, max_tokens=2)
    with pytest.raises(UpstreamShapeError, match="vocabulary"):
        check_ids([512], vocab_size=512)
    with pytest.raises(UpstreamShapeError, match="max_tokens"):
        check_ids(list(range(10)), max_tokens=4)


# -- TokenUpstream over a loopback llama-server fake --------------------------------


async def _fake_llama(ids: list[int], seen: list[dict[str, Any]]) -> tuple[web.AppRunner, str]:
    async def completion(req: web.Request) -> web.StreamResponse:
        body = await req.json()
        seen.append(body)
        if not body.get("stream"):
            return web.json_response(_reply(ids, [(t, 0.5) for t in ids]))
        parts = [_chunk(t, 0.5, k + 1) for k, t in enumerate(ids)]
        parts.append({**_LAST, "tokens_predicted": len(ids)})
        return web.Response(body=b"".join(b"data: " + orjson.dumps(p) + b"\n\n" for p in parts),
                            content_type="text/event-stream")

    app = web.Application()
    app.router.add_post("/completion", completion)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


def _req(extra: dict[str, Any], stream: bool) -> UpstreamRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16,
            "temperature": 0.7, "stream": stream, **extra}
    return UpstreamRequest(orjson.dumps(body), stream=stream, split=False)


@pytest.mark.parametrize("stream", [False, True])
async def test_token_upstream_over_llamacpp(toks: dict[str, ChatTokenizer], stream: bool
                                            ) -> None:
    b = PromptBuilder(toks["qwen25"])
    close = b.family.stop_ids[0]
    ids = [*b.tok.encode("hello there"), close]
    seen: list[dict[str, Any]] = []
    runner, base = await _fake_llama(ids, seen)
    up = TokenUpstream(base, b, api="llamacpp")
    await up.start()
    try:
        req = _req({"top_k": 20, "seed": 1}, stream)
        if stream:
            got: list[int] = []
            lps: list[float] = []
            async for ch in up.stream_chat(req):
                c = ch.data["choices"][0]
                got += c["token_ids"]
                lps += [e["logprob"] for e in c["logprobs"]["content"]]
                finish = c["finish_reason"] or None
        else:
            d = (await up.chat(req)).data["choices"][0]
            got, finish = d["token_ids"], d["finish_reason"]
            lps = [e["logprob"] for e in d["logprobs"]["content"]]
        assert got == ids and lps == [math.log(0.5)] * len(ids) and finish == "stop"
        sent = seen[-1]
        assert sent["prompt"] == b.render_full([{"role": "user", "content": "hi"}]).ids
        assert sent["top_k"] == 20 and sent["seed"] == 1 and sent["post_sampling_probs"]
        with pytest.raises(UpstreamError) as ei:
            await up.chat(_req({"mirostat": 2}, False))
        assert getattr(ei.value, "status", None) == 400 and len(seen) == 1
    finally:
        await up.close()
        await runner.cleanup()


async def test_withheld_token_through_the_proxy_is_nan_and_flagged(
        tok_dirs: dict[str, Path], toks: dict[str, ChatTokenizer]) -> None:
    tok = toks["qwen25"]
    ids = [*tok.encode("hi there"), tok.token_id("<|im_end|>") or 0]

    async def completion(req: web.Request) -> web.Response:
        # The first token's probability entry is missing, as llama-server leaves it out
        # for a token that ends inside a UTF-8 character.
        return web.json_response(_reply(ids, [(t, 0.5) for t in ids[1:]]))

    app = web.Application()
    app.router.add_post("/completion", completion)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    up = make_upstream(url, tokenizer=str(tok_dirs["qwen25"]), upstream_api="llamacpp",
                       model="m")
    try:
        async with Proxy(up) as proxy, aiohttp.ClientSession() as http:
            s = proxy.create_session()
            async with http.post(s.base_url + "/chat/completions",
                                 headers={"Authorization": f"Bearer {s.secret}"},
                                 json={"model": "m", "logprobs": True, "messages": [
                                     {"role": "user", "content": "x"}]}) as r:
                body = await r.json()
            assert r.status == 200
            wire = [e["logprob"] for e in body["choices"][0]["logprobs"]["content"]]
            assert wire[0] is None and wire[1:] == [math.log(0.5)] * (len(ids) - 1)
            await asyncio.sleep(0.05)  # the turn is recorded just after the answer
            (call,) = s.trace.calls
            assert call.error is None and "logprob_unknown" in call.flags
            br = s.trace.branch()
            lps = br.logprobs[-len(ids):]
            assert math.isnan(lps[0]) and br.ids[-len(ids):].tolist() == ids
    finally:
        await runner.cleanup()


async def test_stream_that_withheld_ids_resumes_unstreamed(toks: dict[str, ChatTokenizer]
                                                           ) -> None:
    # The server streams 2 ids, then a chunk whose tokens_predicted says one id before it
    # was withheld: the upstream closes the stream and asks for the rest unstreamed from the
    # 2 ids it has (a fresh draw, the harness seed moved on).
    b = PromptBuilder(toks["qwen25"])
    close = b.family.stop_ids[0]
    head, tail = b.tok.encode("ab"), [*b.tok.encode("cd"), close]
    seen: list[dict[str, Any]] = []

    async def completion(req: web.Request) -> web.StreamResponse:
        body = await req.json()
        seen.append(body)
        if not body.get("stream"):
            return web.json_response(_reply(tail, [(t, 0.25) for t in tail]))
        parts = [_chunk(t, 0.5, k + 1) for k, t in enumerate(head)]
        parts.append(_chunk(tail[0], 0.5, len(head) + 2))  # one id withheld before it
        return web.Response(body=b"".join(b"data: " + orjson.dumps(p) + b"\n\n" for p in parts),
                            content_type="text/event-stream")

    app = web.Application()
    app.router.add_post("/completion", completion)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    up = TokenUpstream(f"http://127.0.0.1:{runner.addresses[0][1]}", b, api="llamacpp")
    await up.start()
    try:
        req = _req({"seed": 5}, True)
        got: list[int] = []
        lps: list[float] = []
        finish = None
        async for ch in up.stream_chat(req):
            c = ch.data["choices"][0]
            got += c["token_ids"]
            lps += [e["logprob"] for e in c["logprobs"]["content"]]
            finish = c["finish_reason"] or finish
        assert got == head + tail and finish == "stop"
        assert lps == [math.log(0.5)] * len(head) + [math.log(0.25)] * len(tail)
        assert "stream_resumed_unstreamed" in req.flags
        first, again = seen
        assert again["prompt"] == first["prompt"] + head and not again["stream"]
        assert again["n_predict"] == first["n_predict"] - len(head)
        assert again["seed"] != first["seed"] == 5
    finally:
        await up.close()
        await runner.cleanup()


def test_a_reply_or_stream_that_never_says_how_it_stopped_is_refused() -> None:
    with pytest.raises(UpstreamShapeError, match="how it stopped"):
        decode_response(L, _reply([5], [(5, 0.5)], "none"))
    dec = StreamDecoder(L)
    dec.feed(_chunk(5, 0.5, 1))
    with pytest.raises(UpstreamShapeError, match="before its last chunk"):
        dec.finish()


def test_raw_logit_logprobs_are_never_recorded() -> None:
    # A server that ignored post_sampling_probs answers "logprob" (softmax of the raw logits).
    raw = {"tokens": [5], "stop_type": "eos", "completion_probabilities": [
        {"id": 5, "logprob": -0.7, "top_logprobs": []}]}
    with pytest.raises(UpstreamShapeError, match="post-sampling"):
        decode_response(L, raw)
