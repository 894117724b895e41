"""``LlamaServer``: a llama.cpp ``llama-server`` child process on one model, started,
waited for until healthy, and stopped — as a sync or an async context manager."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import os
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from pathlib import Path
from types import TracebackType
from typing import IO

from .._children import die_with_parent
from .._errors import EngineError
from ._build import find_llama_server
from ._cache import usable_cpus
from ._model import bundled_model

__all__ = ["LlamaServer", "default_threads"]

#: Context tokens per slot when none is given: SmolLM2's training context.
CTX_PER_SLOT = 8192


def default_threads(parallel: int) -> int | None:
    """Threads for ``parallel`` slots on this machine: on a small one (≤ 8 usable CPUs) one
    per slot, leaving a core for the proxy and the harness; None (llama.cpp's own default)
    on a bigger one."""
    cpus = usable_cpus()
    if cpus > 8:
        return None
    # ggml's worker threads spin-wait for each other at every op: when the OS deschedules
    # one (other processes want the core) the rest spin until it returns, so more threads
    # than free cores collapses throughput (2 threads on 2 shared cores: < 1 token/s,
    # against ~74 with 1).
    return max(1, min(parallel, cpus - 1))


def _terminate(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class LlamaServer:
    """llama-server on ``model`` (default: the bundled SmolLM2 GGUF) at ``host:port`` (port
    0: a free one), with ``parallel`` slots of ``ctx_size / parallel`` tokens each.

    ``start()`` finds (or builds) the binary, fetches the model, starts the child and waits
    for ``/health``; ``stop()`` terminates it. ``url`` is the base URL (no ``/v1``).
    """

    def __init__(self, model: str | Path | None = None, *, host: str = "127.0.0.1",
                 port: int = 0, threads: int | None = None, ctx_size: int | None = None,
                 parallel: int = 1, binary: str | Path | None = None,
                 extra_args: tuple[str, ...] = (), log: IO[bytes] | None = None,
                 start_timeout: float = 120.0) -> None:
        if parallel < 1 or (threads is not None and threads < 1):
            raise ValueError("parallel and threads must be >= 1")
        if ctx_size is not None and ctx_size < parallel:
            raise ValueError("ctx_size must be at least one token per slot")
        if not 0 <= port <= 65535:
            raise ValueError(f"port {port} is not in 0..65535")
        self.model = Path(model) if model is not None else None
        self.host = host
        self.port = port
        self.threads = threads if threads is not None else default_threads(parallel)
        self.ctx_size = ctx_size if ctx_size is not None else CTX_PER_SLOT * parallel
        self.parallel = parallel
        self.binary = Path(binary) if binary is not None else None
        self.extra_args = extra_args
        self.start_timeout = start_timeout
        self._log = log
        self._own_log: IO[bytes] | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self._abort = threading.Event()

    @property
    def url(self) -> str:
        """``http://HOST:PORT`` of the running server."""
        if self.process is None:
            raise EngineError("the llama-server is not started")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def argv(self) -> list[str]:
        """The command line the child runs (binary and model resolved by ``start``)."""
        assert self.binary is not None and self.model is not None
        argv = [str(self.binary), "--model", str(self.model), "--host", self.host,
                "--port", str(self.port), "--ctx-size", str(self.ctx_size),
                "--parallel", str(self.parallel), "--no-webui"]
        if self.threads is not None:
            argv += ["--threads", str(self.threads), "--threads-batch", str(self.threads)]
        return argv + list(self.extra_args)

    def start(self) -> LlamaServer:
        """Start the child and block until it answers ``/health`` (EngineError, with the
        tail of its log, when it exits or stays unhealthy past ``start_timeout``)."""
        if self.process is not None:
            return self
        if self.binary is None:
            self.binary = find_llama_server()
        if self.model is None:
            self.model = bundled_model()
        elif not self.model.is_file():
            raise EngineError(f"model {self.model} is not a file")
        if self.port == 0:
            self.port = _free_port(self.host)
        if self._log is None:
            self._own_log = tempfile.TemporaryFile()  # noqa: SIM115 (closed by stop)
        out = self._log or self._own_log
        try:
            # Its own session: a Ctrl-C at the terminal reaches the parent, which stops the
            # engine when it is done with it (an eval finishes its in-flight turns first).
            # die_with_parent: a SIGKILLed parent (no stop, no atexit) still ends it.
            self.process = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL, stdout=out,
                                            stderr=subprocess.STDOUT, start_new_session=True,
                                            preexec_fn=die_with_parent)
        except OSError as exc:
            raise EngineError(f"cannot run {self.binary}: {exc.strerror}") from exc
        # A safety net for a caller that never stops it: at exit (or when this object is
        # collected) the child is terminated too, so it never outlives a clean exit.
        weakref.finalize(self, _terminate, self.process)
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_healthy(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + self.start_timeout
        while True:
            if self.process.poll() is not None:
                raise EngineError(f"llama-server exited with status {self.process.returncode}"
                                  f" before it was ready: {self._tail()}")
            if self._healthy():
                return
            if self._abort.is_set():
                raise EngineError("llama-server start cancelled")
            if time.monotonic() > deadline:
                raise EngineError(f"llama-server was not healthy after {self.start_timeout:.0f}"
                                  f" s: {self._tail()}")
            self._abort.wait(0.1)

    def _healthy(self) -> bool:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=2)
        try:
            conn.request("GET", "/health")
            return conn.getresponse().status == 200  # 503 while the model loads
        except (OSError, http.client.HTTPException):
            return False
        finally:
            conn.close()

    def _tail(self) -> str:
        log = self._own_log
        if log is None:
            return "(see its log)"
        log.seek(0, os.SEEK_END)
        size = log.tell()
        log.seek(max(0, size - 4000))
        lines = log.read().decode(errors="replace").strip().splitlines()
        useful = [ln for ln in lines if "error" in ln.lower() or "failed" in ln.lower()]
        return (useful or lines or ["(no output)"])[-1][:300]

    def stop(self) -> None:
        """Terminate the child (SIGTERM, then SIGKILL after 10 s) and wait for it."""
        proc, self.process = self.process, None
        if proc is not None:
            _terminate(proc)
        if self._own_log is not None:
            self._own_log.close()
            self._own_log = None

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    async def __aenter__(self) -> LlamaServer:
        # Finding or building the binary, fetching the model and waiting for the model to
        # load all block: a thread keeps the event loop free meanwhile.
        starting = asyncio.ensure_future(asyncio.to_thread(self.start))
        try:
            return await asyncio.shield(starting)
        except asyncio.CancelledError:
            # The thread cannot be cancelled: cut its health wait short, let it finish, and
            # stop whatever child it started, so none outlives the cancellation.
            self._abort.set()
            with contextlib.suppress(BaseException):
                await starting
            await asyncio.to_thread(self.stop)
            raise

    async def __aexit__(self, et: type[BaseException] | None, ev: BaseException | None,
                        tb: TracebackType | None) -> None:
        # Shielded: a cancellation arriving now still lets the thread stop the child.
        await asyncio.shield(asyncio.to_thread(self.stop))
