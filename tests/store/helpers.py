"""Deterministic episodes for the store tests (also imported by the child scripts)."""

from __future__ import annotations

import numpy as np

from tracewire import Call, Episode, Message, Span


def tokens(seed: int, turn: int, n: int) -> np.ndarray:
    """The token ids of ``turn`` of the episode built from ``seed``."""
    return np.random.default_rng([seed, turn]).integers(0, 50_000, n, dtype=np.int32)


def add_turn(ep: Episode, seed: int, turn: int, n: int) -> None:
    """Append one turn (a prompt node and a sampled node of ``n`` tokens each, a call)."""
    t = ep.traces[0]
    parent = len(t.nodes) - 1 if t.nodes else None
    p = t.add_node(Message(role="user", content=f"turn {turn}"), parent=parent,
                   ids=tokens(seed, 2 * turn, n))
    c = t.add_node(Message(role="assistant", content=f"answer {turn}"), parent=p, sampled=True,
                   ids=tokens(seed, 2 * turn + 1, n),
                   logprobs=np.full(n, -0.5, dtype=np.float32))
    t.add_call(Call(model="m", endpoint="chat", finish_reason="stop", node=c, prompt_node=p,
                    usage={"prompt_tokens": n, "completion_tokens": n},
                    span=Span(start=1000.0 + turn, end=1000.5 + turn)))


def build(seed: int, turns: int, n: int, *, task_key: str | None = None,
          group_index: int = 0) -> Episode:
    """A finished episode whose content follows from ``seed``."""
    ep = Episode(env="test", task_key=task_key or f"task-{seed}", group_index=group_index,
                 task={"seed": seed})
    ep.info["seed"], ep.info["n"] = seed, n
    ep.new_trace()
    for k in range(turns):
        add_turn(ep, seed, k, n)
    tr = ep.traces[0]
    tr.set_reward("correct", float(seed % 2))
    tr.metrics["turns"] = float(turns)
    tr.stop = "done"
    tr.completed = True
    return ep


def check(ep: Episode, *, complete: bool = True) -> None:
    """Assert ``ep`` holds exactly what :func:`build` made (a prefix when incomplete)."""
    seed, n = int(ep.task["seed"]), int(ep.info["n"])
    t = ep.traces[0]
    turns = len(t.calls)
    if complete:
        assert t.stop == "done"
    assert len(t.nodes) in (2 * turns, 2 * turns + 1)
    for k, node in enumerate(t.nodes):
        assert np.array_equal(t.columns.ids[node.start : node.end], tokens(seed, k, n))
