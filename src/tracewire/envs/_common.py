"""Helpers shared by the bundled environments: task data files and answer parsing."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from importlib import resources
from typing import Any

__all__ = ["data_tasks", "fmt", "parse_answer"]

_ANSWER = re.compile(r"Answer:\s*(-?\d+(?:\.\d+)?)")


def data_tasks(name: str) -> Callable[[], Iterator[dict[str, Any]]]:
    """A task source reading ``tracewire/env/data/<name>.jsonl`` lazily, row by row."""

    def rows() -> Iterator[dict[str, Any]]:
        path = resources.files("tracewire.env") / "data" / f"{name}.jsonl"
        with path.open("r", encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    yield json.loads(line)

    return rows


def fmt(x: float) -> str:
    """The number format of tool results and answers: integers plain, else up to 4 decimals."""
    if abs(x - round(x)) < 1e-9:
        return str(round(x))
    return f"{x:.4f}".rstrip("0").rstrip(".")


def parse_answer(text: str) -> str | None:
    """The number after the last ``Answer:`` in ``text``, normalized by :func:`fmt`."""
    found = _ANSWER.findall(text)
    if not found:
        return None
    return fmt(float(found[-1]))
