"""A test environment whose turns are slow (for interrupting an eval mid-run)."""

from __future__ import annotations

import time

from tracewire.env import ChatHarness, Environment, Rollout, Task


def respond(task: Task, messages: list[dict[str, object]], rollout: Rollout) -> str | None:
    time.sleep(0.2)  # runs in a worker thread
    return "Lower." if len(messages) < 8 else None


def tasks() -> list[dict[str, object]]:
    return [
        {"key": f"slow-{i:03d}", "system": "You are playing a number guessing game. "
         "Reply with only your guess.", "prompt": "I am thinking of a number from 1 to 100. "
         "You have 6 guesses. What is your first guess?"}
        for i in range(200)
    ]


environment = Environment(
    "slow", tasks=tasks, harness=ChatHarness(respond=respond), sampling={"max_tokens": 6},
    rewards=[lambda task, trace: 0.5],
)
