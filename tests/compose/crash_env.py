"""A test environment whose first rollout of ``crash-000`` ends its worker process.

The crash happens only while the marker file named by ``TW_CRASH_MARKER`` is absent (it is
created just before), so a resumed eval runs that rollout again normally.
"""

from __future__ import annotations

import os
from pathlib import Path

from tracewire.env import ChatHarness, Environment, Rollout, Task


def respond(task: Task, messages: list[dict[str, object]], rollout: Rollout) -> str | None:
    marker = os.environ.get("TW_CRASH_MARKER")
    if task.key == "crash-000" and marker and not Path(marker).exists():
        Path(marker).touch()
        os._exit(3)  # like a worker killed mid-episode (OOM, a segfault in a tool)
    return None


environment = Environment(
    "crash",
    tasks=lambda: [{"key": f"crash-{i:03d}", "prompt": "Say hi."} for i in range(3)],
    harness=ChatHarness(respond=respond), sampling={"max_tokens": 4},
    rewards=[lambda task, trace: 1.0],
)
