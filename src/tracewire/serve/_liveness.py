"""Which clients are still alive: those that promised heartbeats and keep sending them.

On the direct data path the broker sends a client nothing until its run ends, so a client
that died (killed, its machine gone) would hold its workers' slots until the run timeout.
A client that names a heartbeat interval in its run request sends ``hb`` at that interval
while it waits; a client silent for several intervals (never less than ``floor`` seconds)
is taken as gone and its runs are cancelled. Clients that promised nothing are never
judged: one that sends no heartbeats is waited for until the run timeout.
"""

from __future__ import annotations

__all__ = ["MAX_INTERVAL", "MIN_INTERVAL", "ClientWatch"]

#: Bounds on the interval a client may promise (a request is untrusted input).
MIN_INTERVAL = 0.05
MAX_INTERVAL = 60.0
#: Missed heartbeats after which a client is taken as gone.
MISSES = 4


class ClientWatch:
    """Last sign of life of each client that promised heartbeats, and who is overdue."""

    def __init__(self, floor: float) -> None:
        self.floor = floor
        # client -> [last seen, grace]
        self._seen: dict[bytes, list[float]] = {}

    def promise(self, client: bytes, interval: object, now: float) -> None:
        """``client`` said it heartbeats every ``interval`` seconds (ignored if not a number)."""
        if isinstance(interval, int | float) and not isinstance(interval, bool):
            iv = min(max(float(interval), MIN_INTERVAL), MAX_INTERVAL)
            self._seen[client] = [now, max(self.floor, MISSES * iv)]

    def saw(self, client: bytes, now: float) -> None:
        """Any message from ``client`` is a sign of life."""
        entry = self._seen.get(client)
        if entry is not None:
            entry[0] = now

    def lost(self, now: float) -> set[bytes]:
        """Clients silent for longer than their grace."""
        return {c for c, (seen, grace) in self._seen.items() if now - seen > grace}

    def keep_only(self, clients: set[bytes]) -> None:
        """Forget every client not in ``clients`` (those with no run left)."""
        for c in [c for c in self._seen if c not in clients]:
            del self._seen[c]

    def __len__(self) -> int:
        return len(self._seen)
