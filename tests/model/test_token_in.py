"""The built-in model's token-in endpoints over loopback HTTP, read back with the parsers the
token-in/token-out upstream uses (``tracewire.tito.codecs``), so the shapes agree: vLLM
``/v1/completions`` by ids, ``/inference/v1/generate``, SGLang ``/generate``; streamed and
not; logprobs reproduced by rescoring; bad input answered with a typed 4xx."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
import pytest

from tracewire.model import MODEL_NAME, render_chat
from tracewire.model import load_tokenizer as builtin_tokenizer
from tracewire.tito.codecs import (
    Generation,
    SamplingParams,
    StreamDecoder,
    UpstreamApi,
    decode_response,
    encode_request,
    error_message,
    request_path,
)

from .apis import SERVED_APIS

APIS = SERVED_APIS
EOT = builtin_tokenizer().eot_id


def _prompt() -> list[int]:
    return render_chat([{"role": "user", "content": "Convert 40 kg to lb."}])


async def ask(root: str, api: UpstreamApi, prompt: list[int], params: SamplingParams,
              stream: bool, **extra: Any) -> Generation:
    """One request built by the tito encoder, answered by the server, parsed by tito."""
    body = encode_request(api, prompt, params, model=MODEL_NAME, stream=stream)
    body.update(extra)
    async with aiohttp.ClientSession() as s, s.post(root + request_path(api),
                                                    json=body) as r:
        assert r.status == 200, await r.text()
        if not stream:
            return decode_response(api, await r.json())
        assert r.headers["Content-Type"].startswith("text/event-stream")
        dec = StreamDecoder(api)
        chunks = 0
        async for line in r.content:
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            piece = dec.feed(orjson.loads(data))
            assert len(piece.ids) == len(piece.logprobs)
            chunks += 1
        assert chunks >= 1
        return dec.finish()


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("stream", [False, True])
async def test_each_endpoint_parses_with_tito_codecs(root_url: str, api: UpstreamApi,
                                                     stream: bool) -> None:
    prompt = _prompt()
    params = SamplingParams(max_tokens=200, temperature=0.8, top_p=0.95, stop_ids=[EOT],
                            extra={"seed": 11})
    g = await ask(root_url, api, prompt, params, stream)
    assert g.ids and len(g.logprobs) == len(g.ids)
    assert all(lp <= 0 for lp in g.logprobs)
    assert g.finish_reason in ("stop", "length")
    if g.finish_reason == "stop":
        assert g.ids[-1] == EOT and EOT not in g.ids[:-1]
    else:
        assert len(g.ids) == 200
    if api is UpstreamApi.COMPLETIONS:
        assert g.prompt_ids == prompt  # streamed too: on the first chunk
    # the same seed gives the same tokens whichever way it is asked
    again = await ask(root_url, api, prompt, params, not stream)
    assert again.ids == g.ids and again.logprobs == g.logprobs


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9)])
async def test_logprobs_reproduced_by_rescoring(root_url: str, api: UpstreamApi,
                                                temperature: float, top_p: float) -> None:
    prompt = _prompt()
    params = SamplingParams(max_tokens=64, temperature=temperature, top_p=top_p,
                            stop_ids=[EOT], extra={"seed": 3})
    g = await ask(root_url, api, prompt, params, False)
    async with aiohttp.ClientSession() as s:
        body = {"model": MODEL_NAME, "prompt": prompt + g.ids, "echo": True, "logprobs": 0,
                "max_tokens": 0, "temperature": temperature, "top_p": top_p,
                "tracewire": {"tool_choice": "auto"}}
        async with s.post(f"{root_url}/v1/completions", json=body) as r:
            scored = (await r.json())["choices"][0]["logprobs"]["token_logprobs"]
        assert scored[len(prompt):] == g.logprobs
        # SGLang's prompt logprobs (logprob_start_len 0) agree with the same rescoring
        sg = encode_request(UpstreamApi.SGLANG, prompt + g.ids,
                            SamplingParams(max_tokens=1, temperature=temperature, top_p=top_p))
        sg["logprob_start_len"] = 0
        async with s.post(f"{root_url}/generate", json=sg) as r:
            meta = (await r.json())["meta_info"]
        inp = meta["input_token_logprobs"]
        assert [e[1] for e in inp] == prompt + g.ids
        assert inp[0][0] is None and [e[0] for e in inp[1:]] == scored[1:]


@pytest.mark.parametrize("api", APIS)
async def test_stop_token_ids_end_the_completion(root_url: str, api: UpstreamApi) -> None:
    prompt = _prompt()
    free = await ask(root_url, api, prompt,
                     SamplingParams(max_tokens=40, stop_ids=[EOT], extra={"seed": 5}), False)
    assert len(free.ids) > 3
    stop = free.ids[2]
    cut = free.ids.index(stop) + 1
    g = await ask(root_url, api, prompt, SamplingParams(max_tokens=40, stop_ids=[EOT, stop],
                                                        extra={"seed": 5}), False)
    assert g.ids == free.ids[:cut] and g.logprobs == free.logprobs[:cut]
    assert g.finish_reason == "stop"


@pytest.mark.parametrize("api", APIS)
async def test_max_tokens_cuts_by_length(root_url: str, api: UpstreamApi) -> None:
    # a prompt without a generation header makes the model talk as the user for a while
    g = await ask(root_url, api, [1, 2, 3], SamplingParams(max_tokens=5, extra={"seed": 1}),
                  True)
    assert len(g.ids) == len(g.logprobs) <= 5
    if g.finish_reason == "length":
        assert len(g.ids) == 5


async def test_sglang_text_and_stop_trim(root_url: str) -> None:
    prompt = _prompt()
    base = encode_request(UpstreamApi.SGLANG, prompt,
                          SamplingParams(max_tokens=200, stop_ids=[EOT], extra={"seed": 2}))
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{root_url}/generate", json=base) as r:
            kept = await r.json()
        trimmed_body = {**base, "sampling_params": {**base["sampling_params"],
                                                    "no_stop_trim": False,
                                                    "skip_special_tokens": True}}
        async with s.post(f"{root_url}/generate", json=trimmed_body) as r:
            trimmed = await r.json()
    assert kept["output_ids"] == trimmed["output_ids"]
    tok = builtin_tokenizer()
    assert kept["text"] == tok.decode(kept["output_ids"])  # specials spelled, stop kept
    if kept["meta_info"]["finish_reason"]["type"] == "stop":
        assert kept["text"].endswith("<|eot|>")
        assert kept["meta_info"]["finish_reason"]["matched"] == EOT
        assert "<|" not in trimmed["text"]
    assert kept["meta_info"]["completion_tokens"] == len(kept["output_ids"])
    assert kept["meta_info"]["prompt_tokens"] == len(prompt)


BAD: list[tuple[str, dict[str, Any], int, str]] = [
    ("/inference/v1/generate", {"sampling_params": {"max_tokens": 4}}, 400, "token_ids"),
    ("/inference/v1/generate", {"token_ids": [1, "2"]}, 400, "token_ids"),
    ("/inference/v1/generate", {"token_ids": [1, 10**6]}, 400, "token_ids"),
    ("/inference/v1/generate", {"token_ids": [1, True]}, 400, "token_ids"),
    ("/inference/v1/generate", {"token_ids": [1], "sampling_params": [1]}, 400,
     "sampling_params"),
    ("/inference/v1/generate", {"token_ids": [1], "sampling_params": {"max_tokens": 10**7}},
     400, "max_tokens"),
    ("/inference/v1/generate", {"token_ids": [1], "sampling_params": {"logprobs": 99}}, 400,
     "logprobs"),
    ("/inference/v1/generate", {"token_ids": [1], "sampling_params": {"n": 2}}, 400, "n"),
    ("/inference/v1/generate", {"token_ids": [1], "sampling_params": {"stop_token_ids": 5}},
     400, "sampling_params"),
    ("/inference/v1/generate", {"token_ids": [1], "model": "gpt-9"}, 404, "model"),
    ("/inference/v1/generate", {"token_ids": [1], "tracewire": {"non_canonical": 0.5}}, 400,
     "tracewire"),
    ("/generate", {"input_ids": [[1, 2], [3]]}, 400, "input_ids"),
    ("/generate", {"input_ids": []}, 400, "input_ids"),
    ("/generate", {"input_ids": [1, 2], "top_logprobs_num": 50}, 400, "top_logprobs_num"),
    ("/generate", {"input_ids": [1, 2], "logprob_start_len": 5}, 400, "logprob_start_len"),
    ("/generate", {"input_ids": [1, 2], "rid": 7}, 400, "rid"),
    ("/generate", {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": -1}}, 400,
     "max_new_tokens"),
    ("/v1/completions", {"prompt": [1, 2], "stop_token_ids": [-1]}, 400, "stop_token_ids"),
]


@pytest.mark.parametrize("path,body,status,param", BAD)
async def test_bad_input_is_a_typed_4xx(root_url: str, path: str, body: dict[str, Any],
                                        status: int, param: str) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.post(root_url + path, json=body) as r:
            assert r.status == status
            err = await r.json()
        assert error_message(err)  # the token-in upstream can read the server's reason
        assert err["error"]["param"] == param
        async with s.post(root_url + path, data=b"{not json") as r:
            assert r.status == 400
        # and the server keeps serving
        ok = encode_request(UpstreamApi.GENERATE, [1, 2], SamplingParams(max_tokens=2))
        async with s.post(f"{root_url}/inference/v1/generate", json=ok) as r:
            assert r.status == 200


async def test_policy_routes_serve_token_in(server: Any) -> None:
    root = server.base_url.removesuffix("/v1")
    async with aiohttp.ClientSession() as s:
        body = encode_request(UpstreamApi.GENERATE, [1, 2], SamplingParams(max_tokens=2))
        async with s.post(f"{root}/policy/99/inference/v1/generate", json=body) as r:
            assert r.status == 404  # no such version: the same answer as /policy/99/v1
        sg = encode_request(UpstreamApi.SGLANG, [1, 2], SamplingParams(max_tokens=2))
        async with s.post(f"{root}/policy/99/generate", json=sg) as r:
            assert r.status == 404
