"""Run store: durable, indexed, off-loop persistence of episodes, with a read API.

``run = await Run.create("runs/x")``; ``await run.append(episode)``; ``run.journal(ep)``
for in-flight durability; ``await run.close()``. Read with ``open_run("runs/x")``.
"""

from ._journal import Journal
from ._layout import Layout
from ._run import FSYNC_POLICIES, Run, open_run, remove_run
from ._schema import COLUMNS, IndexRow, RecordRef

__all__ = [
    "COLUMNS",
    "FSYNC_POLICIES",
    "IndexRow",
    "Journal",
    "Layout",
    "RecordRef",
    "Run",
    "open_run",
    "remove_run",
]
