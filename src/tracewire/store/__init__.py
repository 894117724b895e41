"""Run store: durable, indexed, off-loop persistence of episodes, with a read API.

``run = await Run.create("runs/x")`` gives a :class:`RunWriter`: ``await run.append(episode)``;
``run.journal(ep)`` for in-flight durability; ``await run.close()``. ``Run.open("runs/x")`` (or
``open_run``) gives a :class:`RunReader`, which changes nothing on disk; ``reader.verify()`` /
``Run.repair(path)`` (``tracewire check [--repair]``) find and fix damage.
"""

from ._cli_check import CHECK_COMMAND
from ._cli_export import EXPORT_COMMAND
from ._cli_import import IMPORT_COMMAND
from ._journal import Journal
from ._layout import Layout
from ._reader import RunReader
from ._run import Run, open_run, remove_run
from ._run_writer import RunWriter
from ._schema import COLUMNS, ROW_CRC, IndexRow, RecordRef, row_crc
from ._status import EpisodeStatus, FsyncPolicy, RunStatus

__all__ = [
    "CHECK_COMMAND",
    "COLUMNS",
    "EXPORT_COMMAND",
    "IMPORT_COMMAND",
    "ROW_CRC",
    "EpisodeStatus",
    "FsyncPolicy",
    "IndexRow",
    "Journal",
    "Layout",
    "RecordRef",
    "Run",
    "RunReader",
    "RunStatus",
    "RunWriter",
    "open_run",
    "remove_run",
    "row_crc",
]
