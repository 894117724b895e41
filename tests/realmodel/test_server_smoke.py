"""The lane's own check: the engine serves token-in completions with per-token logprobs."""

from __future__ import annotations

import json
import urllib.request

from .conftest import LlamaServerProc

# "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n" in SmolLM2's vocabulary.
PROMPT = [1, 4093, 198, 1780, 314, 216, 34, 27, 35, 47, 2, 198, 1, 520, 9531, 198]


def _post(url: str, body: dict[str, object]) -> dict[str, object]:
    req = urllib.request.Request(url, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        out: dict[str, object] = json.loads(r.read())
    return out


def test_completion_returns_ids_and_one_logprob_per_id(llama_server: LlamaServerProc) -> None:
    out = _post(llama_server.url + "/completion",
                {"prompt": PROMPT, "n_predict": 8, "seed": 1, "temperature": 0.8,
                 "n_probs": 1, "return_tokens": True})
    ids = out["tokens"]
    probs = out["completion_probabilities"]
    assert isinstance(ids, list) and isinstance(probs, list)
    assert 0 < len(ids) <= 8
    assert [p["id"] for p in probs] == ids  # type: ignore[index]
    assert all(p["logprob"] <= 0.0 for p in probs)  # type: ignore[index]
    assert out["tokens_evaluated"] == len(PROMPT)
