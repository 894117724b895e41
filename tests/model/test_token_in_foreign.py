"""Serving over a foreign tokenizer directory (the fixture families of ``tracewire.tito``,
loaded offline like a real model's): every token-in endpoint through tito's codecs, stop at
the template's stop id, logprobs recomputed from ids alone, deliberately non-canonical
tokenizations that re-tokenize differently, chat rendered with the directory's own template
through the openai SDK, the ``tracewire model --tokenizer`` command, and typed 4xx."""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

pytest.importorskip("transformers", reason="needs the tracewire[tito] extra (transformers)")

import openai

from tracewire.model import ForeignModel, ModelServer, ServerThread, get_engine
from tracewire.tito import ChatTokenizer
from tracewire.tito.codecs import SamplingParams, UpstreamApi, encode_request, error_message
from tracewire.tito.fixtures import FAMILIES, build_tokenizer_dir

from .apis import SERVED_APIS
from .test_token_in import ask

APIS = SERVED_APIS
MSGS = [{"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "What is the capital of Sweden?"}]


@pytest.fixture(scope="module")
def tok_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tokenizers")
    return {name: build_tokenizer_dir(root / name, name) for name in FAMILIES}


@pytest.fixture(scope="module")
def chat_toks(tok_dirs: dict[str, Path]) -> dict[str, ChatTokenizer]:
    return {name: ChatTokenizer(d) for name, d in tok_dirs.items()}


@pytest.fixture(scope="module")
def servers(tok_dirs: dict[str, Path]) -> Iterator[dict[str, ServerThread]]:
    handles = {name: ModelServer.run_in_thread(seed=3, tokenizer=d)
               for name, d in tok_dirs.items()}
    try:
        yield handles
    finally:
        for h in handles.values():
            h.stop()


def _root(h: ServerThread) -> str:
    return h.base_url.removesuffix("/v1")


def _prompt(ct: ChatTokenizer) -> list[int]:
    return ct.encode(ct.render(MSGS, add_generation_prompt=True))


def _stop(ct: ChatTokenizer) -> int:
    assert ct.eos_id is not None
    return ct.eos_id


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("stream", [False, True])
async def test_endpoints_over_a_fixture_vocabulary(servers: dict[str, ServerThread],
                                                   chat_toks: dict[str, ChatTokenizer],
                                                   family: str, api: UpstreamApi,
                                                   stream: bool) -> None:
    ct = chat_toks[family]
    prompt, stop = _prompt(ct), _stop(ct)
    params = SamplingParams(max_tokens=300, temperature=0.9, stop_ids=[stop],
                            extra={"seed": 4})
    g = await ask(_root(servers[family]), api, prompt, params, stream)
    assert g.ids and len(g.ids) == len(g.logprobs)
    assert all(0 <= t < ct.vocab_size for t in g.ids)
    assert all(lp <= 0 and math.isfinite(lp) for lp in g.logprobs)
    if g.finish_reason == "stop":
        assert g.ids[-1] == stop and stop not in g.ids[:-1]
        body = g.ids[:-1]
    else:
        assert len(g.ids) == 300
        body = g.ids
    assert not set(body) & set(ct.special.values())  # plain text, stop id only at the end
    if g.text is not None and api is UpstreamApi.COMPLETIONS:
        assert g.text == ct.decode(body)  # the stop id is not in the text
    if api is UpstreamApi.COMPLETIONS:
        assert g.prompt_ids == prompt
    again = await ask(_root(servers[family]), api, prompt, params, not stream)
    assert again.ids == g.ids and again.logprobs == g.logprobs


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("split_p", [0.0, 0.4, 1.0])
async def test_logprobs_recomputed_from_ids(servers: dict[str, ServerThread],
                                            chat_toks: dict[str, ChatTokenizer],
                                            tok_dirs: dict[str, Path], family: str,
                                            split_p: float) -> None:
    ct = chat_toks[family]
    prompt, stop = _prompt(ct), _stop(ct)
    fm = ForeignModel(tok_dirs[family], get_engine())
    checked = 0
    for seed in range(6):
        params = SamplingParams(max_tokens=400, temperature=0.8, top_p=0.9, stop_ids=[stop],
                                extra={"seed": seed})
        g = await ask(_root(servers[family]), UpstreamApi.GENERATE, prompt, params, False,
                      tracewire={"non_canonical": split_p})
        if g.finish_reason != "stop":
            continue
        checked += 1
        assert fm.score(prompt, g.ids, 0.8, 0.9, split_p, [stop]) == g.logprobs
        text = ct.decode(g.ids[:-1])
        if split_p not in (0.0, 1.0) and any(len(ct.id_text(t)) > 1 for t in ct.encode(text)):
            # the wrong split probability gives other values: the score is not a replay
            assert fm.score(prompt, g.ids, 0.8, 0.9, 0.1, [stop]) != g.logprobs
    assert checked >= 3


@pytest.mark.parametrize("family", sorted(FAMILIES))
async def test_non_canonical_ids_retokenize_differently(servers: dict[str, ServerThread],
                                                        chat_toks: dict[str, ChatTokenizer],
                                                        family: str) -> None:
    ct = chat_toks[family]
    prompt, stop = _prompt(ct), _stop(ct)
    root = _root(servers[family])

    def body(ids: list[int]) -> list[int]:
        return ids[:-1] if ids and ids[-1] == stop else ids

    for seed in range(30):  # a completion holding at least one multi-character token
        params = SamplingParams(max_tokens=300, stop_ids=[stop], extra={"seed": seed})
        canon = await ask(root, UpstreamApi.COMPLETIONS, prompt, params, False)
        if any(len(ct.id_text(t)) > 1 for t in body(canon.ids)):
            break
    else:
        pytest.fail("no completion held a multi-character token")
    split = await ask(root, UpstreamApi.COMPLETIONS, prompt, params, False,
                      tracewire={"non_canonical": 1.0})
    # canonical mode: the text re-tokenizes to exactly the sampled ids
    assert ct.encode(ct.decode(body(canon.ids))) == body(canon.ids)
    # every multi-character token split: same text, more ids, another tokenization
    assert ct.decode(body(split.ids)) == ct.decode(body(canon.ids))
    assert len(split.ids) > len(canon.ids)
    assert all(len(ct.id_text(t)) == 1 for t in body(split.ids))
    assert ct.encode(ct.decode(body(split.ids))) != body(split.ids)
    assert split.text == canon.text


async def _canonical_and_default(root: str, api: UpstreamApi, ct: ChatTokenizer,
                                 stream: bool) -> tuple[list[int], list[int]]:
    """Bodies (stop id dropped) of a canonical completion holding a multi-character token
    and of the same request under the server's default split probability."""
    prompt, stop = _prompt(ct), _stop(ct)

    def body(ids: list[int]) -> list[int]:
        return ids[:-1] if ids and ids[-1] == stop else ids

    for seed in range(30):
        params = SamplingParams(max_tokens=300, stop_ids=[stop], extra={"seed": seed})
        c = await ask(root, api, prompt, params, stream, tracewire={"non_canonical": False})
        if any(len(ct.id_text(t)) > 1 for t in body(c.ids)):
            g = await ask(root, api, prompt, params, stream)
            return body(c.ids), body(g.ids)
    pytest.fail("no completion held a multi-character token")


async def test_server_default_non_canonical(tok_dirs: dict[str, Path],
                                            chat_toks: dict[str, ChatTokenizer]) -> None:
    ct = chat_toks["qwen25"]
    async with ModelServer(tokenizer=tok_dirs["qwen25"], non_canonical=1.0) as srv:
        canon, split = await _canonical_and_default(srv.base_url.removesuffix("/v1"),
                                                    UpstreamApi.SGLANG, ct, True)
    assert ct.encode(ct.decode(canon)) == canon
    assert ct.decode(split) == ct.decode(canon) and ct.encode(ct.decode(split)) != split


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("stream", [False, True])
def test_chat_renders_with_the_directory_template(servers: dict[str, ServerThread],
                                                  chat_toks: dict[str, ChatTokenizer],
                                                  family: str, stream: bool) -> None:
    ct = chat_toks[family]
    client = openai.OpenAI(base_url=servers[family].base_url, api_key="x", max_retries=0)
    extra = {"return_token_ids": True, "return_tokens_as_token_ids": True}
    if not stream:
        r = client.chat.completions.create(model="tracewire-tiny", messages=MSGS,  # type: ignore[arg-type]
                                           seed=1, logprobs=True, max_tokens=200,
                                           extra_body=extra)
        d = r.model_dump()
        prompt, ids = d["prompt_token_ids"], d["choices"][0]["token_ids"]
        content = d["choices"][0]["message"]["content"]
        lps = d["choices"][0]["logprobs"]["content"]
        finish = d["choices"][0]["finish_reason"]
    else:
        prompt, ids, content, lps, finish = None, [], "", [], None
        for ch in client.chat.completions.create(model="tracewire-tiny", messages=MSGS,  # type: ignore[arg-type]
                                                 seed=1, logprobs=True, max_tokens=200,
                                                 stream=True, extra_body=extra):
            d = ch.model_dump()
            prompt = prompt or d.get("prompt_token_ids")
            c = d["choices"][0]
            ids += c.get("token_ids") or []
            content += c["delta"].get("content") or ""
            lps += (c.get("logprobs") or {}).get("content") or []
            finish = c["finish_reason"] or finish
    assert prompt == _prompt(ct)  # the directory's own chat template, not the built-in one
    assert len(lps) == len(ids) and [e["token"] for e in lps] == [f"token_id:{t}" for t in ids]
    if finish == "stop":
        assert ids[-1] == _stop(ct)
        assert content == ct.decode(ids[:-1])


def test_cli_serves_a_tokenizer_directory(tok_dirs: dict[str, Path],
                                          chat_toks: dict[str, ChatTokenizer]) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tracewire", "model", "--tokenizer", str(tok_dirs["llama3"]),
         "--non-canonical"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1"), proc.stderr
        ct = chat_toks["llama3"]
        canon, split = asyncio.run(_canonical_and_default(url.removesuffix("/v1"),
                                                          UpstreamApi.GENERATE, ct, False))
        assert ct.decode(split) == ct.decode(canon)
        assert ct.encode(ct.decode(split)) != split  # --non-canonical: split by default
    finally:
        proc.terminate()
        proc.communicate(timeout=10)  # reaps it and closes the pipes


@pytest.mark.parametrize("argv", [["--tokenizer", "/nonexistent/dir"],
                                  ["--non-canonical", "0.3"]])
def test_cli_refuses_bad_options_in_one_line(argv: list[str]) -> None:
    r = subprocess.run([sys.executable, "-m", "tracewire", "model", *argv],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("tracewire model: ") and "Traceback" not in r.stderr


FOREIGN_BAD: list[tuple[str, dict[str, Any], str]] = [
    ("/inference/v1/generate", {"token_ids": [1, 5000]}, "token_ids"),
    ("/inference/v1/generate", {"token_ids": [1], "tracewire": {"non_canonical": 2}},
     "tracewire"),
    ("/generate", {"input_ids": [1, 2], "return_logprob": True, "logprob_start_len": 0},
     "logprob_start_len"),
    ("/v1/completions", {"prompt": [1, 2], "echo": True, "logprobs": 0}, "echo"),
    ("/v1/chat/completions", {"messages": "hi"}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": 3},
     "tools"),
]


@pytest.mark.parametrize("path,body,param", FOREIGN_BAD)
async def test_foreign_bad_input_is_a_typed_4xx(servers: dict[str, ServerThread], path: str,
                                                body: dict[str, Any], param: str) -> None:
    root = _root(servers["qwen25"])
    async with aiohttp.ClientSession() as s:
        async with s.post(root + path, json=body) as r:
            assert r.status == 400
            err = await r.json()
        assert error_message(err) and err["error"]["param"] == param
        ok = encode_request(UpstreamApi.GENERATE, [1, 2], SamplingParams(max_tokens=2))
        async with s.post(f"{root}/inference/v1/generate", json=ok) as r:
            assert r.status == 200


async def test_bad_directories_and_options_are_refused(tmp_path: Path) -> None:
    from tracewire import ModelError

    with pytest.raises(ModelError, match=r"no tokenizer\.json"):
        await ModelServer(tokenizer=tmp_path).start()
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ModelError, match="cannot load"):
        await ModelServer(tokenizer=tmp_path).start()
    with pytest.raises(ModelError, match="needs a tokenizer"):
        ModelServer(non_canonical=0.5)
    with pytest.raises(ModelError, match="probability"):
        ModelServer(tokenizer=tmp_path, non_canonical=1.5)
