"""Shutdown drains in-flight runs or fails them explicitly; the CLI exits cleanly."""

from __future__ import annotations

import asyncio
import signal
import sys

import pytest

from tracewire import ServeError
from tracewire.serve import EnvClient, EnvServer, ServerConfig

from .conftest import ADDRESS


async def test_stop_drains_in_flight_runs() -> None:
    server = await EnvServer("standin", address=ADDRESS).start()
    await server.wait_ready()
    async with EnvClient(server.address) as client:
        first = asyncio.Event()
        run = asyncio.create_task(client.run({"turns": 15, "tokens": 5, "delay": 0.02},
                                             on_delta=lambda d, e: first.set()))
        await asyncio.wait_for(first.wait(), 20)
        await server.stop(drain=True, timeout=30)
        res = await asyncio.wait_for(run, 10)
        assert len(res.episode.traces[0].nodes) == 30 and res.episode.traces[0].completed
        assert server.workers.all == {}


async def test_stop_without_drain_fails_runs_and_refuses_new_ones() -> None:
    server = await EnvServer("standin", address=ADDRESS, config=ServerConfig()).start()
    await server.wait_ready()
    async with EnvClient(server.address) as client:
        first = asyncio.Event()
        run = asyncio.create_task(client.run({"turns": 5000, "delay": 0.01},
                                             on_delta=lambda d, e: first.set()))
        await asyncio.wait_for(first.wait(), 20)
        stopping = asyncio.create_task(server.stop(drain=False))
        with pytest.raises(ServeError, match="shut down before the run finished"):
            await asyncio.wait_for(run, 10)
        await stopping


async def test_cli_sigterm_fails_in_flight_runs_after_the_drain_timeout() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tracewire", "serve", "standin", "--address", ADDRESS,
        "--drain-timeout", "0.3", stdout=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        assert line.startswith("serving standin on tcp://127.0.0.1:")
        address = line.split()[-1]
        key_line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        assert key_line.startswith("client key file: ")
        async with EnvClient(address, key_file=key_line.split()[3]) as client:
            await asyncio.wait_for(_until_healthy(client), 30)
            first = asyncio.Event()
            run = asyncio.create_task(client.run({"turns": 5000, "delay": 0.01},
                                                 on_delta=lambda d, e: first.set()))
            await asyncio.wait_for(first.wait(), 20)
            proc.send_signal(signal.SIGTERM)
            with pytest.raises(ServeError, match="shut down before the run finished"):
                await asyncio.wait_for(run, 20)
        assert await asyncio.wait_for(proc.wait(), 20) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def _until_healthy(client: EnvClient) -> None:
    while not (await client.health())["healthy"]:
        await asyncio.sleep(0.05)
