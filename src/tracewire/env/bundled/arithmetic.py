"""``arithmetic``: single-turn word problems; reward 1 for the exact answer after ``Answer:``."""

from __future__ import annotations

from ...trace import Trace
from .. import ChatHarness, Environment, Task, final_text
from ._common import data_tasks, parse_answer

__all__ = ["correct", "load_environment"]


def correct(task: Task, trace: Trace) -> float:
    """1.0 when the final ``Answer: <number>`` equals the task's answer, else 0.0."""
    return 1.0 if parse_answer(final_text(trace)) == task["answer"] else 0.0


def answered(task: Task, trace: Trace) -> float:
    """1.0 when the reply ends with a parseable ``Answer: <number>`` (format compliance)."""
    return 0.0 if parse_answer(final_text(trace)) is None else 1.0


def load_environment() -> Environment:
    """The arithmetic environment (240 word problems; system text and question per task)."""
    return Environment(
        "arithmetic",
        tasks=data_tasks("arithmetic"),
        harness=ChatHarness(prompt=lambda t: str(t["question"])),
        rewards=[correct],
        metrics=[answered],
        sampling={"max_tokens": 64},
        description="Single-turn arithmetic word problems with an exact-answer reward.",
    )
