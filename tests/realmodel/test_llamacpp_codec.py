"""The llamacpp codec against the real llama-server: what it parses equals what the server
put on the wire (read here without tracewire's parser), the close token is recorded,
streamed and unstreamed agree, the server applies the neutral sampler values it was sent,
and the two ways the server withholds ids are handled as documented (NaN unstreamed; a
stream with a gap is a shape error to the decoder, which TokenUpstream resumes
unstreamed)."""

from __future__ import annotations

import math
from typing import Any

import orjson
import pytest

from tracewire.proxy import UpstreamRequest
from tracewire.tito import TokenUpstream, UpstreamShapeError
from tracewire.tito.codecs import (
    SamplingParams,
    StreamDecoder,
    UpstreamApi,
    decode_response,
    encode_request,
)

from .conftest import LlamaServerProc
from .llamacpp_client import chatml, post, post_stream, tokenize

L = UpstreamApi.LLAMACPP
EOS = 2  # <|im_end|> in SmolLM2's vocabulary: its end-of-generation token


def _body(ids: list[int], stream: bool, *, max_tokens: int = 48, temperature: float = 0.8,
          **extra: object) -> dict[str, Any]:
    p = SamplingParams(max_tokens=max_tokens, temperature=temperature, extra=dict(extra))
    return encode_request(L, ids, p, stream=stream)


def test_unstreamed_ids_and_logprobs_are_the_wire_values(llama_server: LlamaServerProc
                                                         ) -> None:
    ids = tokenize(llama_server.url, chatml("What is 2+3?"))
    for seed in range(40):  # a 135M model rambles: take the first seed that closes its turn
        wire = post(llama_server.url, "/completion", _body(ids, False, seed=seed))
        if wire["stop_type"] == "eos":
            break
    g = decode_response(L, wire)
    assert g.ids == wire["tokens"]
    assert g.logprobs == [math.log(e["prob"]) for e in wire["completion_probabilities"]]
    assert [e["id"] for e in wire["completion_probabilities"]] == wire["tokens"]
    assert wire["stop_type"] == "eos" and g.ids[-1] == EOS and g.finish_reason == "stop"
    assert g.usage["prompt_tokens"] == len(ids) == wire["tokens_evaluated"]
    # The server ran exactly the chain it was sent, its truncating defaults neutralised.
    gs = wire["generation_settings"]
    assert gs["samplers"] == ["temperature"] and gs["post_sampling_probs"] is True
    assert gs["top_k"] == 0 and gs["top_p"] == 1.0 and gs["min_p"] == 0.0
    assert gs["repeat_penalty"] == 1.0 and gs["xtc_probability"] == 0.0


def test_limit_is_length(llama_server: LlamaServerProc) -> None:
    ids = tokenize(llama_server.url, chatml("Write a long story about a cat."))
    g = decode_response(L, post(llama_server.url, "/completion",
                                _body(ids, False, max_tokens=5, seed=1)))
    assert len(g.ids) == 5 and g.finish_reason == "length" and not g.ended_by_stop


def test_streamed_equals_unstreamed_and_the_wire(llama_server: LlamaServerProc) -> None:
    ids = tokenize(llama_server.url, chatml("Name three fruits."))
    # Greedy: the same ids whichever way they are asked (sampled runs may differ in the
    # last float bits between a cached and an uncached prompt).
    whole = decode_response(L, post(llama_server.url, "/completion",
                                    _body(ids, False, temperature=0.0)))
    chunks = post_stream(llama_server.url, "/completion", _body(ids, True, temperature=0.0))
    dec = StreamDecoder(L)
    for c in chunks:
        dec.feed(c)
    g = dec.finish()
    wire_ids = [t for c in chunks for t in c.get("tokens", [])]
    assert g.ids == wire_ids == whole.ids
    assert g.logprobs == [math.log(c["completion_probabilities"][0]["prob"])
                          for c in chunks if c.get("tokens")]
    assert g.finish_reason == whole.finish_reason and dec.done


CJK = "中文：你好，世界。我们今天"


def test_withheld_ids_nan_unstreamed_refused_streamed(llama_server: LlamaServerProc
                                                      ) -> None:
    ids = tokenize(llama_server.url, CJK)
    wire = post(llama_server.url, "/completion",
                _body(ids, False, temperature=0.0, max_tokens=12))
    g = decode_response(L, wire)
    assert len(wire["completion_probabilities"]) < len(wire["tokens"])  # the server's gap
    assert g.ids == wire["tokens"]
    nan = [i for i, lp in enumerate(g.logprobs) if math.isnan(lp)]
    assert len(nan) == len(wire["tokens"]) - len(wire["completion_probabilities"])
    dec = StreamDecoder(L)
    with pytest.raises(UpstreamShapeError, match="withheld"):
        for c in post_stream(llama_server.url, "/completion",
                             _body(ids, True, temperature=0.0, max_tokens=12)):
            dec.feed(c)


async def test_token_upstream_resumes_a_stream_that_withheld_ids(
        llama_server: LlamaServerProc) -> None:
    # Greedy, so the streamed-then-resumed completion must be the unstreamed one, id for id.
    up = TokenUpstream(llama_server.url, llama_server.gguf, api="llamacpp")
    await up.start()
    body = {"model": "m", "max_tokens": 40, "temperature": 0.0, "messages": [
        {"role": "user", "content": "Translate to Chinese: Hello, how are you?"}]}
    try:
        whole = (await up.chat(UpstreamRequest(orjson.dumps(body), split=False))).data
        want = whole["choices"][0]["token_ids"]
        req = UpstreamRequest(orjson.dumps({**body, "stream": True}), stream=True, split=False)
        got: list[int] = []
        async for ch in up.stream_chat(req):
            got += ch.data["choices"][0]["token_ids"]
    finally:
        await up.close()
    assert any(e["logprob"] is None or math.isnan(e["logprob"])
               for e in whole["choices"][0]["logprobs"]["content"])  # the server withheld ids
    assert "stream_resumed_unstreamed" in req.flags
    assert got == want
