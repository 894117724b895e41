"""A test environment whose one rollout, after its third model turn, writes the file named
by ``TW_SLOW_REACHED`` and waits until the file named by ``TW_SLOW_RELEASE`` exists (so a
test can kill the eval while the rollout is in flight, and a resumed eval finishes it)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from tracewire.env import ChatHarness, Environment, Rollout, Task

TURNS = 3


def respond(task: Task, messages: list[dict[str, object]], rollout: Rollout) -> str | None:
    answered = sum(1 for m in messages if m.get("role") == "assistant")
    if answered < TURNS:
        return f"Again, please ({answered})."
    reached, release = os.environ.get("TW_SLOW_REACHED"), os.environ.get("TW_SLOW_RELEASE")
    if reached and release:
        Path(reached).touch()
        while not Path(release).exists():  # runs in a thread: the worker's loop streams on
            time.sleep(0.05)
    return None


environment = Environment(
    "slow",
    tasks=lambda: [{"key": "slow-000", "prompt": "Say hi."}],
    harness=ChatHarness(respond=respond), sampling={"max_tokens": 4},
    rewards=[lambda task, trace: 1.0],
)
