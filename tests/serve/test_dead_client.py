"""A client killed mid-run (SIGKILL, a real subprocess) does not keep its worker's slot."""

from __future__ import annotations

import asyncio
import os
import sys

import pytest

from .conftest import client_of, serving, until

LONG = {"turns": 4000, "tokens": 10, "delay": 0.01}  # ~40 s unless stopped

# A separate process, so its death closes its sockets the way a crashed trainer's would.
CLIENT = """
import asyncio, sys
from tracewire.serve import EnvClient

async def main():
    async with EnvClient(sys.argv[1], direct={direct}) as client:
        def first(d, e):
            print("streaming", flush=True)
        await client.run({task!r}, on_delta=first)

asyncio.run(main())
"""


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "broker-path"])
async def test_killed_client_frees_its_runs_and_the_worker(direct: bool) -> None:
    async with serving() as srv:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", CLIENT.format(direct=direct, task=LONG), srv.address,
            stdout=asyncio.subprocess.PIPE,
            # The server's socket is CURVE: the client finds its key where the docs say.
            env={**os.environ, "TRACEWIRE_CLIENT_KEY_FILE": str(srv.client_key_file)})
        try:
            assert proc.stdout is not None
            line = await asyncio.wait_for(proc.stdout.readline(), 60)
            assert line.strip() == b"streaming"
            assert srv.inflight == 1
            proc.kill()  # SIGKILL: no goodbye, sockets closed by the kernel
            await proc.wait()
            # Far below the 600 s run timeout: the broker noticed the client is gone.
            await until(lambda: srv.inflight == 0, "the dead client's run to be cancelled",
                        limit=30)
            await until(lambda: all(not w.jobs for w in srv.workers.all.values()),
                        "the worker to free the slot", limit=30)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        # The worker is not stuck sending to the dead client: it serves the next run.
        async with client_of(srv) as client:
            res = await asyncio.wait_for(client.run({"turns": 2, "tokens": 5}), 30)
        assert len(res.episode.traces[0].nodes) == 4
