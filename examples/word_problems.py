"""Example environment for the README tour: one-turn word problems, scored exactly.

The built-in model is a tiny n-gram model that learned the bundled environments'
transcripts by heart, so this example asks it questions from that data (the bundled
``arithmetic`` rows, read from the package) in the phrasing it was trained on; it answers
about half of them right at temperature 1:

    tracewire eval examples/word_problems.py -n 8 -r 4
"""

from __future__ import annotations

import json
import re
from importlib import resources

from tracewire.env import ChatHarness, Environment, Task, final_text
from tracewire.trace import Trace

SYSTEM = "You are a math tutor. Show the calculation, then end with 'Answer: <number>'."


def tasks() -> list[dict[str, object]]:
    """The additions and subtractions of the bundled data; ``key`` is stable across runs."""
    data = resources.files("tracewire.env.bundled") / "data" / "arithmetic.jsonl"
    rows = [json.loads(line) for line in data.read_text("utf-8").splitlines() if line]
    return [{"key": r["key"], "prompt": r["question"], "answer": int(r["answer"])}
            for r in rows if r["op"] in "+-"]


def exact(task: Task, trace: Trace) -> float:
    """1.0 when the reply ends with the right ``Answer: N``."""
    m = re.search(r"Answer: (-?\d+)\s*$", final_text(trace))
    return 1.0 if m and int(m.group(1)) == task["answer"] else 0.0


def answered(task: Task, trace: Trace) -> float:
    """1.0 when the reply ends with some ``Answer: N`` (format, not correctness)."""
    return 1.0 if re.search(r"Answer: (-?\d+)\s*$", final_text(trace)) else 0.0


environment = Environment(
    "word_problems",
    tasks=tasks,                         # an iterable, or a callable producing one
    harness=ChatHarness(system=SYSTEM),  # the task's "prompt" is the user turn
    rewards=[exact],                     # or (fn, weight) pairs
    metrics=[answered],                  # recorded, not part of the reward
    sampling={"max_tokens": 64},
)
