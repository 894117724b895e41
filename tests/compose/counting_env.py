"""A real environment module that counts how often it is loaded: each call of its
``load_environment()`` (which :func:`tracewire.env.load_environment` makes for every load
by reference) adds one to ``LOADS``."""

from __future__ import annotations

from tracewire.env import ChatHarness, Environment

LOADS = 0


def load_environment() -> Environment:
    """Two short single-turn tasks, answered by whatever model the eval uses."""
    global LOADS
    LOADS += 1
    return Environment(
        "counting",
        tasks=lambda: [{"key": f"count-{i}", "question": f"Count to {i}."} for i in (1, 2)],
        harness=ChatHarness(prompt=lambda t: str(t["question"])),
        rewards=[lambda task, trace: float(len(trace.nodes))],
        sampling={"max_tokens": 6},
    )
