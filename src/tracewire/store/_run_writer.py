"""``RunWriter``: the write side of a run directory (appends, journals, close).

It holds the run's writer lock from :meth:`RunWriter.create` to :meth:`RunWriter.close`;
the loop only queues items for the writer thread (``_writer.py``) and awaits their futures.
"""

from __future__ import annotations

import asyncio
import errno
import os
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from .._errors import StoreError
from ..trace import Episode
from ._journal import Journal
from ._layout import Layout, WriterLock, new_meta, read_meta, store_error, write_meta
from ._reader import RunReader
from ._recover import connect, recover, seal_index
from ._schema import RecordRef
from ._status import FsyncPolicy, RunStatus
from ._writer import AppendItem, FlushItem, JournalItem, Writer

__all__ = ["RunWriter"]

Buffer = bytes | bytearray | memoryview


class RunWriter(RunReader):
    """A run opened for appending (:meth:`create`). Appends are persisted by a writer
    thread in arrival order; the read API of :class:`RunReader` works on it as well."""

    def __init__(
        self, layout: Layout, meta: dict[str, Any], lock: WriterLock, writer: Writer,
        max_queued: int,
    ) -> None:
        super().__init__(layout, meta)
        self._lock: WriterLock | None = lock
        self._writer = writer
        self._journals: dict[str, Journal] = {}
        self._slots = asyncio.Semaphore(max_queued)

    @classmethod
    async def create(
        cls,
        path: str | os.PathLike[str],
        *,
        meta: dict[str, Any] | None = None,
        fsync: FsyncPolicy | str = FsyncPolicy.INTERVAL,
        interval: float = 0.1,
        segment_bytes: int = 256 << 20,
        max_queued: int = 64,
        resume: bool = False,
        switch_interval: float | None = None,
    ) -> RunWriter:
        """Open ``path`` for appending: a new run, or with ``resume`` an existing one
        (recovered first; its new episodes are appended after the old ones).

        ``fsync`` (a :class:`FsyncPolicy` or its string): ``"always"`` (each append returns
        after its bytes are synced), ``"interval"`` (group commit at most every ``interval``
        s) or ``"never"``.
        """
        try:
            fsync = FsyncPolicy(fsync)
        except ValueError:
            known = ", ".join(p.value for p in FsyncPolicy)
            raise ValueError(f"fsync must be one of {known}, not {fsync!r}") from None
        layout = Layout(path)
        config = dict(meta or {})
        run_meta, lock = await asyncio.to_thread(
            _prepare, layout, config, fsync, segment_bytes, resume
        )
        writer = Writer(
            layout,
            fsync=fsync,
            interval=interval,
            segment_bytes=segment_bytes,
            conn_factory=lambda: connect(layout, write=True),
            switch_interval=switch_interval,
        )
        try:
            run = cls(layout, run_meta, lock, writer, max_queued)
        except BaseException:
            lock.release()
            raise
        writer.start()
        return run

    @property
    def writable(self) -> bool:
        """True until :meth:`close`."""
        return not self._closed

    @property
    def meta(self) -> dict[str, Any]:
        """The metadata this writer wrote (config, versions, times, status)."""
        return self._meta

    # -- appending --------------------------------------------------------------------------
    def _need_writer(self) -> Writer:
        w = self._writer
        if self._closed:
            raise StoreError(0, f"run {self.path} is not open for writing")
        if w.fatal is not None:
            raise StoreError(0, f"run {self.path}: writer failed: {w.fatal}") from w.fatal
        return w

    async def _submit(self, episode: Episode | None, frames: Sequence[Buffer] | None) -> RecordRef:
        writer = self._need_writer()
        loop = asyncio.get_running_loop()
        await self._slots.acquire()  # bounded queue: FIFO backpressure
        fut: asyncio.Future[RecordRef] = loop.create_future()
        journal = None
        if episode is not None:
            j = self._journals.pop(episode.id, None)
            if j is not None:
                j.close()
                journal = j.path
        slots = self._slots

        def resolve(ref: RecordRef | None, exc: BaseException | None) -> None:
            slots.release()
            if fut.done():  # the caller was cancelled; the record is stored all the same
                return
            if exc is not None:
                fut.set_exception(exc)
            else:
                assert ref is not None
                fut.set_result(ref)

        def done(ref: RecordRef | None, exc: BaseException | None) -> None:
            try:
                loop.call_soon_threadsafe(resolve, ref, exc)
            except RuntimeError:  # loop closed: nobody is waiting any more
                pass

        writer.q.put(AppendItem(episode, frames, done, journal))
        return await fut

    async def append(self, episode: Episode) -> RecordRef:
        """Persist a finished episode; returns once durable under the fsync policy.

        The store takes ownership of ``episode`` until this returns: do not mutate it while
        the append is pending (it is encoded in the writer thread, sharing its memory).
        Cancelling the caller does not un-append: the record is written whole, or not at all.
        """
        return await self._submit(episode, None)

    async def append_frames(self, frames: Sequence[Buffer]) -> RecordRef:
        """Persist an episode already encoded as frames (``encode_frames``), as they are.

        Only the header is decoded (lightly, for the index row); the buffers are written
        unchanged. They must stay unchanged until this returns.
        """
        return await self._submit(None, frames)

    async def flush(self) -> None:
        """Wait until everything appended or journaled so far is durable and indexed."""
        writer = self._need_writer()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()

        def resolve(exc: BaseException | None) -> None:
            if not fut.done():
                fut.set_exception(exc) if exc else fut.set_result(None)

        def done(_ref: RecordRef | None, exc: BaseException | None) -> None:
            try:
                loop.call_soon_threadsafe(resolve, exc)
            except RuntimeError:
                pass

        writer.q.put(FlushItem(done))
        await fut

    def journal(self, episode: Episode) -> Journal:
        """Journal ``episode``'s deltas on every ``notify()`` until it is appended."""
        writer = self._need_writer()
        old = self._journals.get(episode.id)
        if old is not None and not old.closed:
            return old
        path = self.layout.journal(episode.id)

        def submit(item: JournalItem) -> None:
            writer.q.put(item)

        j = Journal(episode, path, submit)
        self._journals[episode.id] = j
        return j

    # -- closing ----------------------------------------------------------------------------
    async def close(self, status: RunStatus | str = RunStatus.COMPLETE) -> None:
        """Finish pending writes, record ``status`` (complete/interrupted) and release
        the run. Journals still open stay on disk (recovered as incomplete on reopen)."""
        if self._closed:
            return
        writer = self._writer
        for j in self._journals.values():
            j.close()
        self._journals.clear()
        try:
            if writer.fatal is None:
                await self.flush()
        finally:
            writer.stop()
            await asyncio.to_thread(writer.join)
            meta = {**self._meta, "status": RunStatus(status).value, "ended": time.time()}
            try:
                await asyncio.to_thread(write_meta, self.layout, meta)
                self._meta = meta
            finally:
                await asyncio.to_thread(self._release_writer, writer.fatal is None)

    def _release_writer(self, seal: bool) -> None:
        self._release()
        lock, self._lock = self._lock, None
        if lock is not None:
            try:
                if seal:
                    # Still holding the lock, every connection of ours closed: fold the
                    # WAL in, so the closed run is index.sqlite alone.
                    seal_index(self.layout)
            finally:
                lock.release()

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Nothing: a writer is closed with ``await close()`` (or ``async with``)."""

    async def __aenter__(self) -> RunWriter:
        return self


def _prepare(
    layout: Layout, config: dict[str, Any], fsync: str, segment_bytes: int, resume: bool
) -> tuple[dict[str, Any], WriterLock]:
    """Take the writer lock and lay out (or recover, with ``resume``) the run directory."""
    try:
        layout.root.mkdir(parents=True, exist_ok=True)
        lock = layout.try_lock()
    except OSError as exc:
        raise store_error(f"cannot create run {layout.root}", exc) from exc
    if lock is None:
        raise StoreError(errno.EBUSY, f"run {layout.root} already has a live writer")
    try:
        if layout.meta.exists():
            if not resume:
                raise StoreError(errno.EEXIST, f"{layout.root} already holds a run (resume it)")
            recover(layout)
            meta = read_meta(layout)
            meta = {**meta, "status": RunStatus.RUNNING.value, "resumed": time.time(),
                    "ended": None}
            if config:
                meta["config"] = {**meta.get("config", {}), **config}
        else:
            meta = new_meta(layout.root.name, config, fsync, segment_bytes)
        try:
            layout.live.mkdir(exist_ok=True)
            layout.segments.mkdir(exist_ok=True)
        except OSError as exc:
            raise store_error(f"cannot create run {layout.root}", exc) from exc
        write_meta(layout, meta)
        connect(layout, write=True).close()
    except BaseException:
        lock.release()
        raise
    return meta, lock
