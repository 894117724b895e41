"""Is the run's writer still there? A crashed run must not look live forever.

A writer that died (kill -9, power loss) leaves its journals and ``status: running``;
``RunReader.verify()`` reports them as "unrecovered journals" / "not closed" and ``tracewire check
--repair`` stores the journals as incomplete episodes. The viewer only reads, so it tells
the person to repair instead of showing those journals as episodes running now. A writer
holds an exclusive ``flock`` on the run's lock file for its whole life; probing it with a
non-blocking shared lock answers "alive?" without a full check.
"""

from __future__ import annotations

import threading
import time
from enum import StrEnum
from typing import Any

from ..store import Layout, RunStatus

__all__ = ["HealthState", "RunHealth"]

#: Seconds between lock probes (a probe that finds no writer briefly holds a shared lock,
#: during which a new writer could not start; keep those moments rare).
PROBE_EVERY_S = 1.0


class HealthState(StrEnum):
    """A run as the viewer reports it (``/api/health``'s ``state``): closed, being written,
    or left by a writer that died."""

    CLOSED = "closed"
    LIVE = "live"
    NEEDS_REPAIR = "needs_repair"


class RunHealth:
    """Rate-limited answer to "is this run being written, closed, or left by a crash?"."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self._lock = threading.Lock()
        self._at = -1e9
        self._last: dict[str, Any] | None = None

    def check(self, status: Any) -> dict[str, Any]:
        """``{"state": "closed" | "live" | "needs_repair", "journals", "status", "hint"}``
        for the run's recorded ``status`` (blocks briefly: file probes; call off the loop)."""
        with self._lock:
            now = time.monotonic()
            if self._last is not None and self._last.get("status") == status \
                    and now - self._at < PROBE_EVERY_S:
                return self._last
            journals = len(self.layout.journals())
            if status != RunStatus.RUNNING and not journals:
                state = HealthState.CLOSED
            elif self.layout.writer_alive():
                state = HealthState.LIVE
            else:
                state = HealthState.NEEDS_REPAIR
            hint = (f"run `tracewire check --repair {self.layout.root}`"
                    if state == HealthState.NEEDS_REPAIR else None)
            self._last = {"state": state, "journals": journals, "status": status, "hint": hint}
            self._at = now
            return self._last
