"""Example environment for the README tour: count the letters of a word, one turn.

Run it with ``tracewire eval examples/count_letters.py -n 8 -r 4``. With the built-in model
it scores 0.000: that tiny n-gram model only learned the bundled environments'
transcripts, and this task is none of them (``examples/word_problems.py`` is one it can
answer). Every turn is recorded token for token all the same; give ``--base-url`` a real
model server for a real score.
"""

from __future__ import annotations

import re

from tracewire.env import ChatHarness, Environment, Task, final_text
from tracewire.trace import Trace

WORDS = ["apple", "banana", "cherry", "kiwi", "mango", "plum", "grape", "melon", "fig", "lime"]


def tasks() -> list[dict[str, object]]:
    """One task row per word; ``key`` is stable across runs (resume relies on it)."""
    return [{"key": w, "prompt": f"How many letters are in the word '{w}'? "
             "End with 'Answer: <number>'.", "answer": len(w)} for w in WORDS]


def exact(task: Task, trace: Trace) -> float:
    """1.0 when the reply ends with the right ``Answer: N``."""
    m = re.search(r"Answer: (\d+)\s*$", final_text(trace))
    return 1.0 if m and int(m.group(1)) == task["answer"] else 0.0


def length(task: Task, trace: Trace) -> float:
    """Reply length in characters (a metric: recorded, not part of the reward)."""
    return float(len(final_text(trace)))


environment = Environment(
    "count_letters",
    tasks=tasks,
    harness=ChatHarness(system="You count letters."),
    rewards=[exact],
    metrics=[length],
    sampling={"max_tokens": 32},
)
