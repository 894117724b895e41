"""The whole token-in/token-out path offline: tito's TokenUpstream (rendering with a fixture
tokenizer directory) against the built-in model serving that same directory, for every
token-in API, streamed and not, with deliberately non-canonical sampled ids. Each turn's
prompt keeps the previous turn's sampled ids verbatim, and every logprob is recomputed from
the ids alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

pytest.importorskip("transformers", reason="needs the tracewire[tito] extra (transformers)")

from tracewire.model import ForeignModel, ModelServer, get_engine
from tracewire.proxy._upstream_api import UpstreamRequest  # the seam TokenUpstream implements
from tracewire.tito import TokenUpstream
from tracewire.tito.codecs import UpstreamApi
from tracewire.tito.fixtures import FAMILIES, build_tokenizer_dir

from .apis import SERVED_APIS

TURNS = 4
CITIES = ["Norway", "France", "Japan", "Kenya"]


@pytest.fixture(scope="module")
def tok_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tokenizers")
    return {name: build_tokenizer_dir(root / name, name) for name in FAMILIES}


async def _turn(up: Any, msgs: list[dict[str, Any]], stream: bool, seed: int
                ) -> dict[str, Any]:
    body = {"model": "tracewire-tiny", "messages": msgs, "max_tokens": 400,
            "temperature": 0.9, "seed": seed, "stream": stream}
    req = UpstreamRequest(orjson.dumps(body), stream=stream, split=False)
    if not stream:
        r = (await up.chat(req)).data
        c = r["choices"][0]
        return {"prompt": r["prompt_token_ids"], "ids": c["token_ids"],
                "logprobs": [e["logprob"] for e in c["logprobs"]["content"]],
                "content": c["message"]["content"] or "", "finish": c["finish_reason"]}
    prompt, ids, lps, content, finish = None, [], [], "", None
    async for ch in up.stream_chat(req):
        d = ch.data
        prompt = prompt or d.get("prompt_token_ids")
        c = d["choices"][0]
        ids += c["token_ids"]
        lps += [e["logprob"] for e in c["logprobs"]["content"]]
        content += c["delta"].get("content") or ""
        finish = c["finish_reason"] or finish
    return {"prompt": prompt, "ids": ids, "logprobs": lps, "content": content,
            "finish": finish}


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("api", SERVED_APIS)
@pytest.mark.parametrize("stream", [False, True])
async def test_multi_turn_bridges_on_sampled_ids(tok_dirs: dict[str, Path], family: str,
                                                 api: UpstreamApi, stream: bool) -> None:
    fm = ForeignModel(tok_dirs[family], get_engine())
    async with ModelServer(tokenizer=tok_dirs[family], non_canonical=0.7) as srv:
        up = TokenUpstream(srv.base_url.removesuffix("/v1"), tok_dirs[family], api=api,
                           model="tracewire-tiny")
        await up.start()
        try:
            stop = up.builder.family.stop_ids[0]
            msgs: list[dict[str, Any]] = [{"role": "user",
                                           "content": "What is the capital of Sweden?"}]
            prev: list[int] | None = None
            non_canonical = 0
            for t in range(TURNS):
                out = await _turn(up, msgs, stream, seed=t)
                assert len(out["logprobs"]) == len(out["ids"])
                if prev is not None:
                    assert out["prompt"][:len(prev)] == prev  # kept verbatim, not re-rendered
                prev = out["prompt"] + out["ids"]
                if out["finish"] == "stop":
                    assert out["ids"][-1] == stop
                    assert fm.score(out["prompt"], out["ids"], 0.9, 1.0, 0.7, [stop]) \
                        == out["logprobs"]
                    body = out["ids"][:-1]
                    non_canonical += up.builder.tok.encode(up.builder.tok.decode(body)) != body
                msgs.append({"role": "assistant", "content": out["content"]})
                msgs.append({"role": "user", "content": f"What is the capital of {CITIES[t]}?"})
            assert up.session.bridges == TURNS - 1 and not up.session.rerenders
            # split tokens were sampled, and the bridge kept them (checked above)
            assert non_canonical >= 1
        finally:
            await up.close()
