"""Run store: durable, indexed, off-loop persistence of episodes, with a read API.

``run = await Run.create("runs/x")``; ``await run.append(episode)``; ``run.journal(ep)``
for in-flight durability; ``await run.close()``. Read with ``open_run("runs/x")`` (changes
nothing on disk); ``Run.verify()`` / ``Run.repair(path)`` (``tracewire check [--repair]``)
find and fix damage.
"""

from ._journal import Journal
from ._layout import Layout
from ._run import Run, open_run, remove_run
from ._schema import COLUMNS, ROW_CRC, IndexRow, RecordRef, row_crc
from ._status import EpisodeStatus, FsyncPolicy, RunStatus

__all__ = [
    "COLUMNS",
    "ROW_CRC",
    "EpisodeStatus",
    "FsyncPolicy",
    "IndexRow",
    "Journal",
    "Layout",
    "RecordRef",
    "Run",
    "RunStatus",
    "open_run",
    "remove_run",
    "row_crc",
]
