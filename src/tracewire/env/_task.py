"""A task row: a stable key and its data (the unit a rollout runs)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .._errors import EnvError

__all__ = ["Task", "as_task"]


@dataclass(frozen=True)
class Task:
    """One task row: a stable ``key`` (unique within the environment) and its data."""

    key: str
    data: Mapping[str, Any] = field(default_factory=dict)

    def __getitem__(self, name: str) -> Any:
        return self.data[name]

    def get(self, name: str, default: Any = None) -> Any:
        """``data[name]`` or ``default``."""
        return self.data.get(name, default)


def as_task(row: Task | Mapping[str, Any], index: int) -> Task:
    """Turn a task row (a :class:`Task` or a mapping, keyed by ``key``/``id``) into a Task."""
    if isinstance(row, Task):
        return row
    if not isinstance(row, Mapping):
        raise EnvError(f"task {index} is a {type(row).__name__}, not a Task or a mapping")
    key = row.get("key", row.get("id"))
    return Task(key=str(index) if key is None else str(key), data=dict(row))
