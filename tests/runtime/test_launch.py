"""The in-sandbox launcher's relay, run on the host (loopback only) with a real Unix-socket
server as its host end: bytes go both ways on many connections at once, and a connection
it cannot take for want of file descriptors is answered 503 at once, naming why, while the
connections it holds keep working."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tracewire.runtime import _launch

LAUNCH = Path(_launch.__file__)
PYTHON = os.path.realpath(sys.executable)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


REFUSAL = b"HTTP/1.1 403 Refused\r\nContent-Length: 2\r\nConnection: close\r\n\r\nno"


async def _echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        while data := await r.read(65536):
            if data.startswith(b"REFUSE"):
                # As the host relay does: answer and close while the body still comes.
                w.write(REFUSAL)
                await w.drain()
                break
            w.write(data.upper())
            await w.drain()
    w.close()


@contextlib.asynccontextmanager
async def launcher(nofile: int | None = None
                   ) -> AsyncIterator[tuple[int, asyncio.subprocess.Process]]:
    """An echo server on a Unix socket (upper-casing what it gets; ``REFUSE…`` gets a 403
    and a close) and a launcher relaying ``127.0.0.1:PORT`` to it, optionally with
    ``RLIMIT_NOFILE`` = ``nofile``."""
    echo = _echo

    with tempfile.TemporaryDirectory(prefix="tw-launch-") as d:
        path = os.path.join(d, "s.sock")
        server = await asyncio.start_unix_server(echo, path)
        port = _free_port()
        pre = [shutil.which("prlimit") or "prlimit", f"--nofile={nofile}", "--"] if nofile else []
        proc = await asyncio.create_subprocess_exec(
            *pre, PYTHON, "-I", "-S", str(LAUNCH), str(port), path, "--", "sleep", "60",
            stderr=asyncio.subprocess.PIPE, start_new_session=True)
        try:
            for _ in range(200):  # until it listens
                try:
                    _, w = await asyncio.open_connection("127.0.0.1", port)
                    w.close()
                    break
                except OSError:
                    await asyncio.sleep(0.05)
            yield port, proc
        finally:
            # The whole group: the launcher's `sleep` holds its stderr pipe open too.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            server.close()
            await server.wait_closed()


async def test_relays_both_ways_on_many_connections() -> None:
    async with launcher() as (port, _):
        conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(20)]
        big = os.urandom(3 << 20).hex().encode()[: 3 << 20]  # ascii, > the high-water mark
        for i, (_, w) in enumerate(conns):
            w.write(b"hello %d " % i + (big if i == 0 else b""))
            await w.drain()
        for i, (r, w) in enumerate(conns):
            want = (b"hello %d " % i + (big if i == 0 else b"")).upper()
            got = await asyncio.wait_for(r.readexactly(len(want)), 60)
            assert got == want
            w.write_eof()  # half-close passes through: the echo server ends, so do we
            assert await asyncio.wait_for(r.read(), 30) == b""
            w.close()


async def test_an_answer_before_the_body_ends_still_reaches_the_client() -> None:
    async with launcher() as (port, _):
        for _ in range(5):
            r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(b"REFUSE please\r\n")
            await w.drain()

            # The rest of a 512 KiB body (under the relay's lingering bound), sent while
            # the host end has already answered and closed: the answer must survive it.
            for _ in range(8):
                w.write(b"x" * 65536)
                await w.drain()
            got = await asyncio.wait_for(r.read(), 30)
            assert got == REFUSAL
            w.close()


async def test_out_of_descriptors_answers_503_and_keeps_the_others() -> None:
    async with launcher(nofile=16) as (port, proc):
        held = []
        refused = b""
        for _ in range(12):
            r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(b"ping")
            await w.drain()
            got = await asyncio.wait_for(r.read(4096), 30)
            if got.startswith(b"HTTP/1.1 503"):
                refused = got
                w.close()
                break
            assert got == b"PING"
            held.append((r, w))
        assert refused, "the descriptor limit was never reached"
        assert b"tracewire sandbox relay:" in refused, refused
        assert held, "no connection was relayed before the limit"
        for r, w in held:  # still relayed
            w.write(b"again")
            await w.drain()
            assert await asyncio.wait_for(r.readexactly(5), 30) == b"AGAIN"
            w.close()
        # Descriptors freed by those closes are used again (once the relay has seen them).
        answers = []
        for _ in range(100):
            r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(b"x")
            await w.drain()
            answers.append(await asyncio.wait_for(r.read(4096), 30))
            w.close()
            if answers[-1] == b"X":
                break
            await asyncio.sleep(0.05)
        assert answers[-1] == b"X", answers[-3:]
        os.killpg(proc.pid, signal.SIGKILL)
        assert proc.stderr is not None
        err = await asyncio.wait_for(proc.stderr.read(), 30)
    assert b"tracewire sandbox relay:" in err


@pytest.mark.parametrize("argv", [["1"], ["1", "x", "y"]])
async def test_usage_errors(argv: list[str]) -> None:
    p = await asyncio.create_subprocess_exec(PYTHON, "-I", "-S", str(LAUNCH), *argv,
                                             stderr=asyncio.subprocess.PIPE)
    _, err = await p.communicate()
    assert p.returncode == 2 and b"usage" in err
