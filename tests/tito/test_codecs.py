"""The token-in/token-out codecs against loopback fakes of vLLM completions/generate and
SGLang generate: request shape, ids and logprobs read back, streamed and not, and a reply
with a logprob missing is refused (502)."""

from __future__ import annotations

import orjson
import pytest
from aiohttp import ClientSession

from tracewire.tito import UpstreamShapeError
from tracewire.tito.codecs import (
    SamplingParams,
    StreamDecoder,
    UpstreamApi,
    decode_response,
    encode_request,
    request_path,
)

from .fake_servers import Script, start_fake

PROMPT = [5, 6, 7, 8]
PARAMS = SamplingParams(max_tokens=32, temperature=0.7, stop_ids=(511,), top_logprobs=1,
                        extra={"seed": 3, "bogus": 1})


async def _call(api: UpstreamApi, script: Script, stream: bool) -> object:
    runner, base = await start_fake(script)
    try:
        body = encode_request(api, PROMPT, PARAMS, model="m", stream=stream, request_id="r1")
        async with ClientSession() as http, http.post(base + request_path(api),
                                                      json=body) as resp:
            assert resp.status == 200
            if not stream:
                return decode_response(api, await resp.json())
            dec = StreamDecoder(api)
            deltas = []
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                deltas.append(dec.feed(orjson.loads(line[6:])))
            assert sum(len(d.ids) for d in deltas) == len(script.ids)
            return dec.finish()
    finally:
        await runner.cleanup()


CASES = [(UpstreamApi.COMPLETIONS, False), (UpstreamApi.COMPLETIONS, True),
         (UpstreamApi.GENERATE, False), (UpstreamApi.SGLANG, False),
         (UpstreamApi.SGLANG, True)]


@pytest.mark.parametrize(("api", "stream"), CASES)
async def test_round_trip(api: UpstreamApi, stream: bool) -> None:
    script = Script(ids=[40, 41, 42, 511], text="abc", finish="stop")
    g = await _call(api, script, stream)
    assert g.ids == [40, 41, 42, 511]  # type: ignore[attr-defined]
    assert g.logprobs == pytest.approx([-0.5, -0.51, -0.52, -0.53])  # type: ignore[attr-defined]
    assert g.ended_by_stop  # type: ignore[attr-defined]
    sent = script.requests[0]
    assert "bogus" not in orjson.dumps(sent).decode()  # only known sampling keys travel
    if api is UpstreamApi.COMPLETIONS:
        assert g.prompt_ids == PROMPT  # type: ignore[attr-defined]
        assert g.text == "abc"  # type: ignore[attr-defined]
        assert sent["seed"] == 3 and sent["stop_token_ids"] == [511]
    if api is UpstreamApi.SGLANG:
        assert sent["sampling_params"]["stop_token_ids"] == [511] and sent["rid"] == "r1"


@pytest.mark.parametrize(("api", "stream"), CASES)
async def test_short_logprobs_is_refused(api: UpstreamApi, stream: bool) -> None:
    script = Script(ids=[40, 41, 42], finish="length", short_logprobs=True)
    with pytest.raises(UpstreamShapeError) as ei:
        await _call(api, script, stream)
    assert ei.value.status == 502


async def test_length_finish() -> None:
    g = await _call(UpstreamApi.SGLANG, Script(ids=[1, 2], finish="length"), False)
    assert not g.ended_by_stop  # type: ignore[attr-defined]


@pytest.mark.parametrize("body", [
    {"choices": []}, {"error": {"message": "model overloaded"}},
    {"choices": [{"token_ids": ["a"], "logprobs": None}]},
    {"choices": [{"token_ids": [1, 2], "logprobs": {"tokens": ["token_id:1", "token_id:3"],
                                                  "token_logprobs": [-1.0, -1.0]}}]},
    [1, 2],
])
def test_bad_bodies(body: object) -> None:
    with pytest.raises(UpstreamShapeError):
        decode_response(UpstreamApi.COMPLETIONS, body)


def test_error_message_is_kept() -> None:
    with pytest.raises(UpstreamShapeError, match="model overloaded"):
        decode_response(UpstreamApi.COMPLETIONS, {"error": {"message": "model overloaded"}})
