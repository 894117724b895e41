"""Sampling honesty through llama-server: the logprob the llamacpp codec records is the
log-probability of the sampled token under the distribution it was drawn from.

Proved empirically on the real model: at temperature 0.7 with top_k 20 and top_p 0.9, one
token from a fixed prompt under 1,000 seeds; each token's frequency matches exp(recorded
logprob) within a Bernstein bound (and the mass of tokens never drawn is as small), while
the softmax of the raw logits (what llama-server reports without ``post_sampling_probs``)
fails the same bound. The reported distribution is also the one vLLM's order defines
(temperature, then top-k, then top-p), computed here from the raw logits.
"""

from __future__ import annotations

import collections
import math

import pytest

from tracewire.tito.codecs import SamplingParams, UpstreamApi, decode_response, encode_request

from .conftest import LlamaServerProc
from .llamacpp_client import chatml, post, tokenize

N = 1000
T, TOP_K, TOP_P = 0.7, 20, 0.9
#: Chance that an honest record fails the test (split over the buckets).
DELTA = 1e-4
PROMPT = "Pick a random number between 1 and 10."


def _bernstein(p: float, n: int, buckets: int) -> float:
    """Half-width ε with P(|freq - p| ≥ ε) ≤ DELTA / buckets for n Bernoulli(p) draws."""
    lg = math.log(2 * buckets / DELTA)
    return (lg / 3 + math.sqrt(lg * lg / 9 + 2 * n * p * (1 - p) * lg)) / n


def _violations(freq: dict[int, float], p: dict[int, float], n: int) -> list[str]:
    """Buckets (each drawn token, plus 'never drawn') whose frequency is outside the
    bound around ``p``."""
    buckets = len(freq) + 1
    out = [f"id {t}: freq {f:.3f} vs p {p.get(t, 0.0):.3f}" for t, f in freq.items()
           if abs(f - p.get(t, 0.0)) > _bernstein(p.get(t, 0.0), n, buckets)]
    rest = max(0.0, 1.0 - sum(p.get(t, 0.0) for t in freq))
    if rest > _bernstein(rest, n, buckets):
        out.append(f"never-drawn tokens: freq 0 vs p {rest:.3f}")
    return out


def _params(seed: int, top_logprobs: int = 0) -> SamplingParams:
    return SamplingParams(max_tokens=1, temperature=T, top_p=TOP_P, top_logprobs=top_logprobs,
                          extra={"top_k": TOP_K, "seed": seed})


@pytest.fixture(scope="module")
def draws(llama_server: LlamaServerProc) -> tuple[list[int], dict[int, list[float]]]:
    ids = tokenize(llama_server.url, chatml(PROMPT))
    drawn: list[int] = []
    recorded: dict[int, list[float]] = collections.defaultdict(list)
    for seed in range(N):
        body = encode_request(UpstreamApi.LLAMACPP, ids, _params(seed))
        gen = decode_response(UpstreamApi.LLAMACPP, post(llama_server.url, "/completion", body))
        assert len(gen.ids) == 1 and len(gen.logprobs) == 1
        drawn.append(gen.ids[0])
        recorded[gen.ids[0]].append(gen.logprobs[0])
    return ids, recorded


def test_recorded_logprobs_match_the_sampling_frequencies(
        draws: tuple[list[int], dict[int, list[float]]]) -> None:
    _, recorded = draws
    freq = {t: len(v) / N for t, v in recorded.items()}
    assert len(freq) >= 3  # the prompt really samples several tokens at this setting
    p = {}
    for t, lps in recorded.items():
        # One distribution for a fixed prompt: every draw of a token records one value.
        assert max(lps) - min(lps) < 1e-4, (t, min(lps), max(lps))
        p[t] = math.exp(lps[0])
    assert _violations(freq, p, N) == []


def test_raw_logit_probabilities_fail_the_same_bound(
        llama_server: LlamaServerProc, draws: tuple[list[int], dict[int, list[float]]]) -> None:
    ids, recorded = draws
    freq = {t: len(v) / N for t, v in recorded.items()}
    body = encode_request(UpstreamApi.LLAMACPP, ids, _params(0, top_logprobs=60))
    body["post_sampling_probs"] = False  # what llama-server reports by default
    d = post(llama_server.url, "/completion", body)
    raw = {e["id"]: math.exp(e["logprob"])
           for e in d["completion_probabilities"][0]["top_logprobs"]}
    assert set(freq) <= set(raw)
    bad = _violations(freq, raw, N)
    assert any(b.startswith("never-drawn") for b in bad) and len(bad) >= 2, bad


def test_reported_distribution_is_temperature_then_top_k_then_top_p(
        llama_server: LlamaServerProc, draws: tuple[list[int], dict[int, list[float]]]) -> None:
    ids, recorded = draws
    body = encode_request(UpstreamApi.LLAMACPP, ids, _params(0, top_logprobs=60))
    post_probs = {e["id"]: e["prob"] for e in post(llama_server.url, "/completion", body)[
        "completion_probabilities"][0]["top_probs"]}
    raw_body = dict(body, post_sampling_probs=False)
    raw = sorted(((math.exp(e["logprob"]), e["id"]) for e in post(
        llama_server.url, "/completion", raw_body)["completion_probabilities"][0][
        "top_logprobs"]), reverse=True)[:TOP_K]
    # vLLM's order from the raw softmax: scale by 1/T, keep the top k, then the smallest
    # prefix reaching top_p, renormalised.
    w = [(q ** (1 / T), t) for q, t in raw]
    z = sum(x for x, _ in w)
    kept, cum = [], 0.0
    for x, t in w:
        kept.append((x / z, t))
        cum += x / z
        if cum >= TOP_P:
            break
    zk = sum(x for x, _ in kept)
    want = {t: x / zk for x, t in kept}
    assert set(want) == set(post_probs)
    assert all(abs(want[t] - post_probs[t]) < 1e-3 for t in want), (want, post_probs)
    assert set(recorded) <= set(want)  # nothing outside the truncated set was ever drawn
