"""The runs a viewer can compare against: those named on the command line and the run's
siblings (directories next to it holding a ``meta.json``), opened on first use.

Only those names resolve: a request can never make the viewer open an arbitrary path.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

from ._source import RunSource

__all__ = ["MAX_SIBLINGS", "RunRegistry"]

#: Sibling directories listed at most.
MAX_SIBLINGS = 200
NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")


class RunRegistry:
    """Named runs: the viewed one, the ones given with it, and its siblings (thread-safe)."""

    def __init__(self, main: RunSource, given: list[Path]) -> None:
        self.main = main
        self._lock = threading.Lock()
        self._given: dict[str, Path] = {}
        for p in given:
            name = p.name
            k = 2
            while name in self._given or name == main.run_dir.name:
                name, k = f"{p.name}-{k}", k + 1
            self._given[name] = p
        self._open: dict[str, RunSource] = {main.run_dir.name: main}

    @property
    def name(self) -> str:
        """The viewed run's name."""
        return self.main.run_dir.name

    def default_other(self) -> str | None:
        """The first run given next to the viewed one (``tracewire view A B``), if any."""
        return next(iter(self._given), None)

    def _siblings(self) -> list[Path]:
        parent = self.main.run_dir.resolve().parent
        out: list[Path] = []
        try:
            entries = sorted(parent.iterdir())
        except OSError:
            return out
        for p in entries:
            if len(out) >= MAX_SIBLINGS:
                break
            if p.is_dir() and (p / "meta.json").is_file() and NAME_RE.match(p.name):
                out.append(p)
        return out

    def listing(self) -> list[dict[str, Any]]:
        """``[{"name", "given", "current"}]``: the viewed run first, then given, siblings
        (blocks: lists a directory; call from a worker thread)."""
        rows = [{"name": self.name, "given": True, "current": True}]
        rows += [{"name": n, "given": True, "current": False} for n in self._given]
        me = self.main.run_dir.resolve()
        known = {p.resolve() for p in self._given.values()}
        rows += [{"name": p.name, "given": False, "current": False} for p in self._siblings()
                 if p.resolve() != me and p.resolve() not in known and p.name not in self._given]
        return rows

    def get(self, name: str) -> RunSource | None:
        """The run called ``name`` (opened once), or None when no such run is offered."""
        if not NAME_RE.match(name):
            return None
        with self._lock:
            src = self._open.get(name)
            if src is not None:
                return src
        path = self._given.get(name)
        if path is None:
            path = next((p for p in self._siblings() if p.name == name), None)
        if path is None:
            return None
        with self._lock:
            src = self._open.get(name)
            if src is None:
                src = self._open[name] = RunSource(path)
            return src
