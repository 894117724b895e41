"""``Run``: the entry point to a run directory, handing out a reader or a writer."""

from __future__ import annotations

import abc
import errno
import os
import shutil
from typing import Any

from .._errors import StoreError
from ._check import CheckReport, repair_run
from ._layout import Layout, store_error
from ._reader import RunReader
from ._run_writer import RunWriter

__all__ = ["Run", "open_run", "remove_run"]


class Run(abc.ABC):  # noqa: B024 - no abstract methods: a namespace and a virtual base
    """Where a run directory is opened: :meth:`create` gives a :class:`RunWriter`,
    :meth:`open` a :class:`RunReader` (both are instances of ``Run``; annotate with them)."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Run:
        raise TypeError("open a run with `await Run.create(path)` or `Run.open(path)`")

    #: ``await Run.create(path, ...)``: open ``path`` for appending (:meth:`RunWriter.create`).
    create = RunWriter.create
    #: ``Run.open(path)``: open ``path`` for reading, changing nothing (:meth:`RunReader.open`).
    open = RunReader.open

    @staticmethod
    def repair(path: str | os.PathLike[str]) -> CheckReport:
        """Repair the run at ``path`` on purpose (no writer may hold it): truncate a torn
        tail, index what is missing, rewrite wrong rows, store leftover journals as
        incomplete. Intact records are never deleted. Returns a check made afterwards."""
        return repair_run(path)


Run.register(RunReader)  # so code asking isinstance(x, Run) keeps working


def open_run(path: str | os.PathLike[str]) -> RunReader:
    """Open a run directory for reading; changes nothing on disk (see :meth:`Run.open`)."""
    return RunReader.open(path)


def remove_run(path: str | os.PathLike[str]) -> None:
    """Delete a run directory (refuses while a writer holds it)."""
    layout = Layout(path)
    try:
        lock = layout.try_lock()
    except OSError as exc:
        raise store_error(f"cannot remove run {path}", exc) from exc
    if lock is None:
        raise StoreError(errno.EBUSY, f"run {path} has a live writer")
    lock.release()
    shutil.rmtree(layout.root)
