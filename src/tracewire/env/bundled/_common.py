"""Helpers shared by the bundled environments: task data files and answer parsing."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any

__all__ = ["JsonlTasks", "data_tasks", "fmt", "parse_answer"]

# The scoring rule of data/README.md: the reply ends with ``Answer: <number>``.
_ANSWER = re.compile(r"Answer: (-?[0-9.]+)\s*$")


class JsonlTasks:
    """A task source reading ``tracewire/env/bundled/data/<name>.jsonl`` lazily, row by row; sized
    (``len`` counts the rows once)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._len: int | None = None

    def _path(self) -> Traversable:
        return resources.files("tracewire.env.bundled") / "data" / f"{self.name}.jsonl"

    def __call__(self) -> Iterator[dict[str, Any]]:
        with self._path().open("r", encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    yield json.loads(line)

    def __len__(self) -> int:
        if self._len is None:
            with self._path().open("r", encoding="utf-8") as f:
                self._len = sum(1 for line in f if line.strip())
        return self._len


def data_tasks(name: str) -> JsonlTasks:
    """The bundled task file ``name`` as a lazy, sized task source."""
    return JsonlTasks(name)


def fmt(x: float) -> str:
    """The number format of tool results and answers: integers plain, else up to 4 decimals."""
    if abs(x - round(x)) < 1e-9:
        return str(round(x))
    return f"{x:.4f}".rstrip("0").rstrip(".")


def parse_answer(text: str) -> str | None:
    """The number in the ``Answer: <number>`` that ends ``text``, as written (None if none)."""
    m = _ANSWER.search(text)
    return m.group(1) if m else None
