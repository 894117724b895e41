"""The train loop through the real path: proxy sessions, the session payload, the store."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tracewire.samples import Sample
from tracewire.store import open_run
from tracewire.train import TrainConfig, group_advantages, pg_coefficients, train

# Every bundled env's harness speaks the chat-completions dialect (ChatHarness,
# ToolsHarness, and the command env's agent program through the openai SDK).
ENVS = ["arithmetic", "tools", "guess", "command"]


@pytest.mark.parametrize("env", ENVS)
async def test_on_policy_mismatch_is_exactly_zero(env: str, tmp_path: Path) -> None:
    cfg = TrainConfig(steps=2, group_size=3, tasks_per_step=2, lr=5.0, concurrency=6)
    seen: dict[int, list[Sample]] = {}
    result = await train(env, cfg, out=tmp_path / "run",
                         on_samples=lambda step, samples: seen.setdefault(step, samples))
    assert [s.step for s in result.steps] == [0, 1]
    for step, samples in seen.items():
        for smp in samples:  # the policy version travels in the payload's metadata
            assert smp.metadata["policy_version"] == step == smp.metadata["step"]
            assert smp.logprobs is not None and smp.loss_mask.any()
    for s in result.steps:
        assert s.tokens > 0 and s.samples >= 6 and s.dropped == 0
        assert s.mismatch_max == 0.0 and s.mismatch_kl == 0.0
        assert s.staleness == 0 and s.sampled_by == s.policy_version == s.step
    assert result.policy.version == 2
    run = open_run(result.run_dir)
    episodes = list(run)
    assert len(episodes) == 12
    for ep in episodes:
        assert ep.info["policy_version"] == ep.info["step"]
    assert (result.run_dir / "train_steps.jsonl").read_text().count("\n") == 2


async def test_stale_batches_are_rescored_under_their_weights(tmp_path: Path) -> None:
    # K=1: batch k+1 rolls out on version k while step k trains; its samples are one
    # version stale when used, so the ratio against the current weights is not 1, while
    # the mismatch (rescored under the version that sampled them) is still exactly 0.
    cfg = TrainConfig(steps=4, group_size=4, tasks_per_step=2, lr=20.0, max_staleness=1,
                      n_tasks=4)
    result = await train("arithmetic", cfg, out=tmp_path / "run")
    stale = [s for s in result.steps if s.staleness == 1]
    assert [s.staleness for s in result.steps] == [0, 1, 1, 1]
    for s in result.steps:
        assert s.mismatch_max == 0.0
    assert any(s.ratio_max > 1.0 + 1e-6 for s in stale)
    versions = {(ep.info["step"], ep.info["policy_version"]) for ep in open_run(result.run_dir)}
    assert versions == {(0, 0), (1, 0), (2, 1), (3, 2)}


def test_clipped_importance_weights() -> None:
    lp_old = np.log(np.array([0.5, 0.5, 0.5, 0.5]))
    lp = np.log(np.array([0.55, 0.7, 0.3, 0.45]))  # ratios 1.1, 1.4, 0.6, 0.9
    coef, ratio, clipped = pg_coefficients(lp, lp_old, 1.0, clip=0.2)
    assert ratio == pytest.approx([1.1, 1.4, 0.6, 0.9])
    # positive advantage: only a ratio above 1 + clip stops the gradient
    assert clipped.tolist() == [False, True, False, False]
    assert coef == pytest.approx([1.1, 0.0, 0.6, 0.9])
    coef, _, clipped = pg_coefficients(lp, lp_old, -2.0, clip=0.2)
    # negative advantage: only a ratio below 1 - clip stops it
    assert clipped.tolist() == [False, False, True, False]
    assert coef == pytest.approx([-2.2, -2.8, 0.0, -1.8])


def test_group_advantages() -> None:
    adv = group_advantages([1.0, 0.0, 1.0, 0.0, 1.0, 1.0], ["a", "a", "a", "a", "b", "b"])
    assert adv[:4] == pytest.approx([1.0, -1.0, 1.0, -1.0], abs=1e-5)
    assert adv[4:].tolist() == [0.0, 0.0]  # nothing to learn from a uniform group
