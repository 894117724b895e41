"""Closed vocabularies of the run store, as ``StrEnum``s whose values are the strings that
``meta.json`` and the index have always held (so old runs read the same)."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["EpisodeStatus", "FsyncPolicy", "RunStatus"]


class RunStatus(StrEnum):
    """A run's ``meta["status"]``: a writer holds it, it closed cleanly, or it stopped early."""

    RUNNING = "running"
    COMPLETE = "complete"
    INTERRUPTED = "interrupted"


class FsyncPolicy(StrEnum):
    """When appended bytes are synced: each append, group commits, or left to the kernel."""

    ALWAYS = "always"
    INTERVAL = "interval"
    NEVER = "never"


class EpisodeStatus(StrEnum):
    """An index row's ``status``: appended whole, or rebuilt from a journal after a crash."""

    COMPLETE = "complete"
    INCOMPLETE = "incomplete"
