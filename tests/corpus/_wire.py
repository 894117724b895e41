"""Corpus case of the env server's wire: every message a raw DEALER client receives."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgspec

from ._runs import Corpus, det, run_files

__all__ = ["WIRE_CASES", "wire_frames"]

#: (case, run body): stand-in turns paced well past the streamer's poll (0.05 s) and
#: coalescing (0.002 s) timers, so each turn is exactly one delta whatever the load.
WIRE_CASES: list[tuple[str, dict[str, Any]]] = [
    ("standin-stream", {"task": {"key": "a", "turns": 3, "tokens": 24, "delay": 0.15},
                        "stream": True}),
    ("standin-stream-b", {"task": {"key": "b", "turns": 2, "tokens": 5, "delay": 0.15},
                          "stream": True}),
    ("standin-episode", {"task": {"key": "c", "turns": 4, "tokens": 40},
                         "stream": False, "keep_frames": True}),
]


async def wire_frames(work: Path, out: Corpus) -> None:
    import zmq
    import zmq.asyncio

    from tracewire.serve import (
        PROTOCOL_VERSION,
        EnvClient,
        EnvServer,
        InlinePool,
        ServerConfig,
    )
    from tracewire.store import Run
    from tracewire.trace import SCHEMA_VERSION

    server = EnvServer("standin", address="tcp://127.0.0.1:0",
                       config=ServerConfig(curve=False), pool=InlinePool())
    await server.start()
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    run = await Run.create(work / "wire", meta={"corpus": "wire"})
    try:
        await server.wait_ready(timeout=60)
        sock.connect(server.address)
        for case, body in WIRE_CASES:
            det.reseed(f"wire/{case}")
            rid = f"rid-{case}"
            await sock.send_multipart([msgspec.msgpack.encode(
                [PROTOCOL_VERSION, SCHEMA_VERSION, "run", rid, body])])
            messages: list[list[bytes]] = []
            while True:
                frames = await asyncio.wait_for(sock.recv_multipart(), 30)
                messages.append(frames)
                kind = msgspec.msgpack.decode(frames[0])[2]
                if kind in ("reply", "error"):
                    break
            if kind == "error":
                raise RuntimeError(f"{case}: {msgspec.msgpack.decode(frames[0])}")
            out[f"wire/{case}.msgs"] = msgspec.msgpack.encode(messages)
            if body.get("keep_frames"):
                await run.append_frames(messages[-1][1:])  # stored as received
        # The public client on the direct path (the worker sends to the client's own PULL
        # socket): the whole episode's frames as RunResult.frames hands them over.
        async with EnvClient(server.address) as client:
            det.reseed("wire/client-episode")
            got = await client.run({"key": "d", "turns": 3, "tokens": 16}, keep_frames=True,
                                   request_id="rid-client-episode")
            assert got.frames is not None
            out["wire/client-episode.msgs"] = msgspec.msgpack.encode(
                [[b"", *[bytes(f) for f in got.frames]]])
            await run.append_frames(got.frames)
    finally:
        await run.close()
        sock.close()
        ctx.term()
        await server.stop(drain=False, timeout=5)
    run_files("records/wire", work / "wire", out)
