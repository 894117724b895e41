"""Where workers come from: the :class:`WorkerPool` interface and the local process pool.

The broker asks a pool to start a worker that connects to the broker's worker endpoint and
speaks the worker protocol; it learns a worker is alive from its ``ready`` and heartbeats,
and that it is gone from :meth:`WorkerHandle.wait` (or missing heartbeats). Nothing else
about the pool reaches the broker or any client, so another backend (e.g. the Ray actors of
``_ray``, connecting over TCP) only has to implement these two small classes.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import os
import sys
from typing import Any

import msgspec
import zmq

from .._errors import ServeError
from ._config import WorkerConfig

__all__ = ["InlinePool", "LocalProcessPool", "ProcessHandle", "TaskHandle", "WorkerHandle",
           "WorkerPool"]

log = logging.getLogger("tracewire.serve")


class WorkerHandle(abc.ABC):
    """One started worker, as seen by the broker."""

    #: Operating-system process id, when the worker is a local process.
    pid: int | None = None
    #: Where it runs, for errors and ``stats`` (e.g. an actor id and node), if not a pid.
    where: str | None = None

    @abc.abstractmethod
    async def wait(self) -> int:
        """Wait until the worker has exited; return its exit status (negative: signal)."""

    @abc.abstractmethod
    def kill(self) -> None:
        """Stop the worker at once (it may be hung)."""

    @abc.abstractmethod
    def terminate(self) -> None:
        """Ask the worker's process to exit."""


class WorkerPool(abc.ABC):
    """Starts workers that connect to a broker; a backend implements this and nothing more."""

    #: True when workers run inside the broker's process; the broker then also binds an
    #: ``inproc://`` endpoint and hands it to :meth:`attach` (messages pass by reference).
    in_process: bool = False
    #: Workers run on the broker's host, so they can reach a client's loopback data address
    #: (the direct path, see ``_direct``); a pool of remote workers sets this False.
    same_host: bool = True
    #: The backend's name, for ``health`` and ``stats``.
    name: str = "process"

    def prepare(self) -> None:  # noqa: B027 (optional hook, default does nothing)
        """Blocking set-up before serving (e.g. joining a cluster); idempotent.

        The server calls it on start; call it before the event loop runs to keep that
        stall off the loop.
        """

    def attach(self, context: zmq.Context[Any], endpoint: str) -> None:  # noqa: B027
        """Receive the broker's ZMQ context and in-process endpoint (``in_process`` pools)."""

    @abc.abstractmethod
    async def start(self, config: WorkerConfig) -> WorkerHandle:
        """Start one worker with ``config`` (its id, endpoint, env and runner factory)."""

    async def close(self) -> None:  # noqa: B027 (optional hook, default does nothing)
        """Release whatever the pool holds (called once, after every worker has exited)."""


class ProcessHandle(WorkerHandle):
    """A worker running as a local subprocess."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.pid = proc.pid

    async def wait(self) -> int:
        return await self.proc.wait()

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()

    def terminate(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.terminate()


class LocalProcessPool(WorkerPool):
    """Starts each worker as ``python -m tracewire.serve._worker`` on this machine.

    The configuration (with the worker's secret key) goes down a pipe on its standard
    input, never on its command line or in its environment, which others on the host read.
    """

    def __init__(self, python: str | None = None, env: dict[str, str] | None = None) -> None:
        self.python = python or sys.executable
        self.env = env

    async def start(self, config: WorkerConfig) -> WorkerHandle:
        proc = await asyncio.create_subprocess_exec(
            self.python, "-m", "tracewire.serve._worker",
            stdin=asyncio.subprocess.PIPE,
            env={**os.environ, **self.env} if self.env else None,
        )
        assert proc.stdin is not None
        try:
            proc.stdin.write(msgspec.json.encode(config))
            await proc.stdin.drain()
            proc.stdin.close()
        except (BrokenPipeError, ConnectionResetError):
            pass  # it died at once; wait() reports its status
        return ProcessHandle(proc)


class TaskHandle(WorkerHandle):
    """A worker running as a task on the broker's event loop."""

    def __init__(self, task: asyncio.Task[int]) -> None:
        self.task = task

    async def wait(self) -> int:
        await asyncio.wait({self.task})
        if self.task.cancelled():
            return -9
        exc = self.task.exception()
        if exc is not None:
            log.error("in-process worker failed: %r", exc)
            return 1
        return self.task.result()

    def kill(self) -> None:
        self.task.cancel()

    def terminate(self) -> None:
        self.task.cancel()


class InlinePool(WorkerPool):
    """Runs each worker as a task in the broker's process, connected over ``inproc://``.

    No process hop and no copy between broker and worker, so on a small machine more of it
    is left for the runners; but runners share the broker's event loop, so use it only for
    runners that yield often (e.g. the stand-in), and there is no isolation from crashes.
    """

    in_process = True
    name = "inline"

    def __init__(self) -> None:
        self.context: zmq.Context[Any] | None = None
        self.endpoint: str | None = None

    def attach(self, context: zmq.Context[Any], endpoint: str) -> None:
        self.context, self.endpoint = context, endpoint

    async def start(self, config: WorkerConfig) -> WorkerHandle:
        from ._worker import serve_worker  # the worker module is heavier; load on use

        if self.context is None or self.endpoint is None:
            raise ServeError("InlinePool is not attached to a server")
        cfg = msgspec.structs.replace(config, endpoint=self.endpoint)
        return TaskHandle(asyncio.create_task(serve_worker(cfg, self.context),
                                              name=f"inline-{config.worker_id}"))
