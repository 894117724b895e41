"""An environment whose agent is ``sdk_loop_agent.py``: an unmodified openai SDK multi-turn
loop in a subprocess (streamed or not, per task), for the real-engine lane's end-to-end
tests (``tracewire eval tests/realmodel/sdk_loop_env.py --engine llamacpp``)."""

from __future__ import annotations

import json
from pathlib import Path

from tracewire.env import CommandHarness, Environment, Task
from tracewire.trace import Trace

AGENT = Path(__file__).with_name("sdk_loop_agent.py")
TURNS = ["Name a colour.", "Why that one?", "Now name a fruit of that colour.",
         "Write one short sentence about it."]


def _tasks() -> list[Task]:
    return [Task(key=f"loop-{k}-{'stream' if s else 'plain'}",
                 data={"turns": TURNS, "stream": s, "max_tokens": 48, "temperature": 1.0,
                       "seed": 100 + k})
            for k in range(2) for s in (False, True)]


def _ran(task: Task, trace: Trace) -> float:
    command = trace.info.get("command") or {}
    try:
        messages = json.loads(str(command.get("stdout", "")))
    except ValueError:
        return 0.0
    return 1.0 if len(messages) == 1 + 2 * len(TURNS) else 0.0


def load_environment() -> Environment:
    """Two conversations of four turns, each plain and streamed."""
    return Environment(
        "sdk_loop",
        tasks=_tasks(),
        harness=CommandHarness(["{python}", "{workdir}/sdk_loop_agent.py"], input="stdin",
                               files=lambda _t: {AGENT.name: AGENT.read_text("utf-8")}),
        rewards=[_ran],
        description="An openai SDK multi-turn loop in a subprocess.",
    )
