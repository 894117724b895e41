"""Running one process to its end or its deadline, keeping the tails of its output as they
arrive (so a timeout still reports what was printed), and killing its whole group."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence

from ._api import OUTPUT_TAIL, ExecResult, SandboxError

__all__ = ["ProcessHook", "run_process"]

_KILL_GRACE_S = 2.0
#: ``hook("spawn", pid)`` once the program has started, ``hook("exit", status)`` when it
#: has exited by itself (not when it is killed on a timeout or cancellation). asyncio
#: reports an exit once the program's output pipes have closed too: a child that keeps
#: them open delays it (and a deadline meanwhile means no ``exit``).
ProcessHook = Callable[[str, int], None]


async def _drain(stream: asyncio.StreamReader | None, result: ExecResult, name: str) -> None:
    if stream is None:
        return
    buf = bytearray()
    while chunk := await stream.read(65536):
        buf += chunk
        if len(buf) > 2 * OUTPUT_TAIL:
            del buf[: len(buf) - OUTPUT_TAIL]
        # Published after every chunk so a cancelled exec still shows what it printed.
        setattr(result, name, bytes(buf[-OUTPUT_TAIL:]))


def _kill_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


async def _stop(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM the group, SIGKILL it after a grace period, and reap the leader."""
    _kill_group(proc.pid, signal.SIGTERM)
    try:
        await asyncio.wait_for(asyncio.shield(proc.wait()), _KILL_GRACE_S)
    except TimeoutError:
        pass
    # Whatever is left of the group (children that ignored SIGTERM) goes now.
    _kill_group(proc.pid, signal.SIGKILL)
    await proc.wait()


async def run_process(
    argv: Sequence[str],
    result: ExecResult,
    *,
    env: Mapping[str, str],
    cwd: str | os.PathLike[str] | None,
    timeout: float | None,
    stdin: bytes | None,
    after_exit: Callable[[], None] | None = None,
    watch: Callable[[], str | None] | None = None,
    watch_s: float = 0.1,
    on_process: ProcessHook | None = None,
) -> ExecResult:
    """Run ``argv`` in a new session; fill ``result`` in place and return it. On timeout
    the group is killed and ``timed_out`` set; on cancellation it is killed and the
    ``CancelledError`` propagates (``result`` keeps what was captured). ``watch()`` is
    called every ``watch_s`` while it runs: a limit's name back kills the group and sets
    ``result.limit`` (a bound the kernel does not enforce by killing, e.g. a full disk).
    ``on_process`` hears the program start and exit (see :data:`ProcessHook`)."""
    t0 = time.monotonic()
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env=dict(env), cwd=cwd, start_new_session=True,
        )
    except OSError as exc:
        raise SandboxError(f"cannot start {argv[0]!r}: {exc}") from exc
    result.extra["pid"] = proc.pid
    readers = asyncio.gather(_drain(proc.stdout, result, "stdout"),
                             _drain(proc.stderr, result, "stderr"))

    async def feed_and_wait() -> int:
        if on_process is not None:
            # Inside the guarded wait: a hook that raises still gets the group killed.
            on_process("spawn", proc.pid)
        if proc.stdin is not None and stdin is not None:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                proc.stdin.write(stdin)
                await proc.stdin.drain()
            proc.stdin.close()
        code = await proc.wait()
        if on_process is not None:
            on_process("exit", code)
        await readers
        return code

    async def watcher() -> None:
        assert watch is not None
        while proc.returncode is None:
            await asyncio.sleep(watch_s)
            why = watch()
            if why is not None and proc.returncode is None:
                result.limit = why
                _kill_group(proc.pid, signal.SIGKILL)
                return

    watching = asyncio.ensure_future(watcher()) if watch is not None else None

    try:
        result.exit_code = await asyncio.wait_for(feed_and_wait(), timeout)
    except TimeoutError:
        result.timed_out = True
        await _stop(proc)
        result.exit_code = proc.returncode
    except BaseException:
        result.cancelled = True
        await asyncio.shield(_stop(proc))
        result.exit_code = proc.returncode
        raise
    finally:
        if watching is not None:
            watching.cancel()
        if proc.returncode is None:
            _kill_group(proc.pid, signal.SIGKILL)
        # The pipes close when the group is gone; give the readers a moment to finish.
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(asyncio.shield(readers), 1.0)
        readers.cancel()
        result.duration_s = time.monotonic() - t0
        if after_exit is not None:
            after_exit()
    return result
