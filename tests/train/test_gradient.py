"""The trainable model: sampled logprobs are reproducible and the gradient is exact."""

from __future__ import annotations

import numpy as np
import pytest

from tracewire.model import (
    ChatTemplate,
    Generation,
    Policy,
    SamplingParams,
    get_engine,
    rescore,
)

TOOLS = [{"type": "function", "function": {"name": "calculator", "parameters": {
    "type": "object", "properties": {"expression": {"type": "string"}}}}}]
MSGS = [{"role": "system", "content": "You can call tools. Use a tool to compute the result, "
         "then reply with the answer."},
        {"role": "user", "content": "What is 12 * 7?"}]


def _random_policy(seed: int, scale: float = 0.5) -> Policy:
    rng = np.random.default_rng(seed)
    v = get_engine().tok.vocab_size
    base = Policy.zeros(v)
    return base.updated(rng.normal(0, scale, v), rng.normal(0, scale, (v, v)), 1)


def _sampled(policy: Policy, temperature: float, top_p: float, seed: int,
             ) -> tuple[list[int], list[int], list[float]]:
    e = get_engine()
    tpl = ChatTemplate(e.tok)
    prompt = tpl.render(MSGS, TOOLS)
    params = SamplingParams(temperature=temperature, top_p=top_p, max_tokens=60,
                            tool_names=("calculator",))
    gen = Generation(e, prompt, params, np.random.default_rng(seed), policy)
    lps = []
    while (step := gen.step()) is not None:
        lps.append(step.logprob)
    return prompt, gen.tokens, lps


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9), (1.3, 0.95)])
def test_rescored_logprobs_equal_sampled_ones_exactly(temperature: float, top_p: float) -> None:
    e = get_engine()
    tpl = ChatTemplate(e.tok)
    policy = _random_policy(1)
    for seed in range(4):
        prompt, out, lps = _sampled(policy, temperature, top_p, seed)
        ids = prompt + out
        mask = [0] * len(prompt) + [1] * len(out)
        rs = rescore(e, tpl, ids, mask, len(prompt), policy, temperature, top_p)
        assert rs.logprobs.tolist() == lps  # bit for bit, not approximately
        # and other weights give other numbers (the check above can fail)
        other = rescore(e, tpl, ids, mask, len(prompt), _random_policy(2), temperature, top_p)
        assert other.logprobs.tolist() != lps


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_gradient_matches_finite_differences(temperature: float, top_p: float) -> None:
    e = get_engine()
    tpl = ChatTemplate(e.tok)
    rng = np.random.default_rng(3)
    v = e.tok.vocab_size
    base = _random_policy(4, 0.3)
    prompt, out, _ = _sampled(base, temperature, top_p, 5)
    ids = prompt + out
    mask = [0] * len(prompt) + [1] * len(out)
    # context rows with random values on exactly the contexts this sequence uses
    keys = {k for i in range(len(prompt), len(ids))
            for k in Policy.context_keys(ids[max(0, i - 32):i])}
    policy = base.updated(np.zeros(v), np.zeros((v, v)), 2,
                          {k: rng.normal(0, 0.3, v) for k in keys})
    rs = rescore(e, tpl, ids, mask, len(prompt), policy, temperature, top_p, grad=True)
    assert rs.grads is not None and rs.grads.shape == (len(out), v)
    eps = 1e-6
    checked = 0
    for j in rng.choice(len(out), size=min(8, len(out)), replace=False):
        g = rs.grads[j]
        support = np.flatnonzero(g)
        if support.size < 2:
            continue  # a forced token: gradient 0, nothing to differentiate
        token, prev = int(rs.tokens[j]), int(rs.prev[j])
        key = rs.keys[j][-1]
        for which in ("bias", "pair", "row"):
            for col in (token, int(support[rng.integers(support.size)])):
                d = np.zeros(v)
                d[col] = eps

                def lp_with(sign: float, which: str = which, d: np.ndarray = d, prev: int = prev,
                            key: object = key, j: int = int(j)) -> float:
                    db, dp = np.zeros(v), np.zeros((v, v))
                    rows = {}
                    if which == "bias":
                        db = sign * d
                    elif which == "pair":
                        dp[prev] = sign * d
                    else:
                        rows = {key: sign * d}
                    p2 = policy.updated(db, dp, 3, rows)
                    r2 = rescore(e, tpl, ids, mask, len(prompt), p2, temperature, top_p)
                    return float(r2.logprobs[j])

                numeric = (lp_with(1.0) - lp_with(-1.0)) / (2 * eps)
                assert numeric == pytest.approx(g[col], abs=1e-6, rel=1e-4), (which, col)
                checked += 1
    assert checked >= 12


def test_zero_policy_is_the_untrained_distribution() -> None:
    e = get_engine()
    tpl = ChatTemplate(e.tok)
    prompt, out, _ = _sampled(Policy.zeros(e.tok.vocab_size), 1.0, 1.0, 9)
    ids, mask = prompt + out, [0] * len(prompt) + [1] * len(out)
    a = rescore(e, tpl, ids, mask, len(prompt), Policy.zeros(e.tok.vocab_size))
    b = rescore(e, tpl, ids, mask, len(prompt), None)
    assert np.allclose(a.logprobs, b.logprobs, atol=1e-9)
