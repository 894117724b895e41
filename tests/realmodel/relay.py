"""A recording HTTP relay for the real-engine lane: it sits between a client and llama-server,
forwards every request and answer unchanged (streamed answers chunk by chunk) and keeps the
raw bytes of both, so a test can check the wire itself — not through tracewire's parsers.

Two ways to use it:
- in process: ``async with Relay(upstream) as relay`` → ``relay.url``, ``relay.records``;
- as a stand-in ``llama-server`` binary (``wrapper_script``): ``TRACEWIRE_LLAMA_SERVER``
  points at a script that starts the real server on another port and this relay on the
  port it was given, appending one JSON line per exchange to ``$RELAY_LOG``. So
  ``tracewire eval --engine llamacpp`` runs unmodified with the relay in its path.

``rewrite`` (in-process only) may change a request body before it is sent: used to ask the
chat endpoint for the per-token ids it only reports with ``top_logprobs`` set.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

Rewrite = Callable[[str, dict[str, Any]], dict[str, Any]]


@dataclass
class Record:
    """One exchange as it crossed the wire."""

    path: str
    request: bytes
    status: int
    response: bytes
    #: False when the client hung up before the whole answer was relayed.
    delivered: bool = True


class Relay:
    """Forwards ``127.0.0.1:port`` to ``upstream`` and records every exchange."""

    def __init__(self, upstream: str, *, port: int = 0, log: Path | None = None,
                 rewrite: Rewrite | None = None) -> None:
        self.upstream = upstream.rstrip("/")
        self.port = port
        self.log = log
        self.rewrite = rewrite
        self.records: list[Record] = []
        self._runner: web.AppRunner | None = None
        self._http: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> Relay:
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600))
        app = web.Application(client_max_size=64 << 20)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._http is not None:
            await self._http.close()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        assert self._http is not None
        body = await request.read()
        if self.rewrite is not None and body:
            body = json.dumps(self.rewrite(request.path, json.loads(body))).encode()
        headers = {"Content-Type": request.headers.get("Content-Type", "application/json")}
        try:
            up = await self._http.request(request.method, self.upstream + request.path_qs,
                                          data=body or None, headers=headers)
        except aiohttp.ClientConnectionError:
            return web.Response(status=503, text="upstream not listening yet")
        out = web.StreamResponse(status=up.status, headers={
            "Content-Type": up.headers.get("Content-Type", "application/json")})
        await out.prepare(request)
        got = bytearray()
        delivered = True
        async with up:
            async for chunk in up.content.iter_any():
                got += chunk
                try:
                    await out.write(chunk)
                except (ConnectionError, aiohttp.ClientConnectionResetError):
                    # The client hung up (the proxy gave up on a stream): hang up on the
                    # server too, as the client's own close would have; the record keeps
                    # what had arrived.
                    delivered = False
                    break
        if request.path != "/health":
            self._keep(Record(request.path, body, up.status, bytes(got), delivered))
        if delivered:
            await out.write_eof()
        return out

    def _keep(self, record: Record) -> None:
        self.records.append(record)
        if self.log is not None:
            line = json.dumps({"path": record.path, "status": record.status,
                               "request": record.request.decode(),
                               "response": record.response.decode(),
                               "delivered": record.delivered})
            with self.log.open("a") as f:
                f.write(line + "\n")


def read_log(path: Path) -> list[Record]:
    """The records a stand-in binary appended to ``path``."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        d = json.loads(line)
        out.append(Record(d["path"], d["request"].encode(), d["status"],
                          d["response"].encode(), d["delivered"]))
    return out


def wrapper_script(folder: Path, real_binary: Path, log: Path) -> Path:
    """An executable ``llama-server`` stand-in: the real server behind a recording relay."""
    script = folder / "llama-server"
    script.write_text(f"#!/bin/sh\nRELAY_REAL={_q(real_binary)} RELAY_LOG={_q(log)} "
                      f"exec {_q(Path(sys.executable))} {_q(Path(__file__))} \"$@\"\n")
    script.chmod(0o755)
    return script


def _q(path: Path) -> str:
    return "'" + str(path).replace("'", "'\\''") + "'"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _serve_as_binary(argv: list[str]) -> int:
    # Same arguments as llama-server, but the real one listens elsewhere.
    port = int(argv[argv.index("--port") + 1])
    inner = list(argv)
    inner_port = _free_port()
    inner[inner.index("--port") + 1] = str(inner_port)
    real = await asyncio.create_subprocess_exec(os.environ["RELAY_REAL"], *inner,
                                                stdin=subprocess.DEVNULL)
    log = Path(os.environ["RELAY_LOG"])
    with log.with_suffix(".pids").open("a") as f:  # for the tests' no-orphan checks
        f.write(f"{os.getpid()} {real.pid}\n")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        async with Relay(f"http://127.0.0.1:{inner_port}", port=port, log=log):
            waiter = asyncio.create_task(real.wait())
            stopper = asyncio.create_task(stop.wait())
            await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
            stopper.cancel()
            waiter.cancel()
    finally:
        if real.returncode is None:
            real.terminate()
            try:
                await asyncio.wait_for(real.wait(), 10)
            except TimeoutError:
                real.kill()
                await real.wait()
    return 0 if stop.is_set() else (real.returncode or 1)


def gone(pid: int, within: float = 30.0) -> bool:
    """Whether process ``pid`` is reaped or dead (a zombie) within ``within`` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


def pids(log: Path) -> list[int]:
    """The stand-in's and its real server's pids, for every start that used ``log``."""
    path = log.with_suffix(".pids")
    return [int(x) for x in path.read_text().split()] if path.exists() else []


if __name__ == "__main__":
    sys.exit(asyncio.run(_serve_as_binary(sys.argv[1:])))
