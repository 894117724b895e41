"""Malformed frames and other protocol versions get clear errors; nothing stops serving."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest
import zmq
import zmq.asyncio

from tracewire import ProtocolError
from tracewire.codec import EpisodeSender, encode_frames
from tracewire.serve import PROTOCOL_VERSION, EnvClient
from tracewire.serve._auth import local_key
from tracewire.serve._protocol import decode_envelope, encode_envelope
from tracewire.trace import Episode

from .conftest import client_of, serving


async def _raw(address: str, frames: list[bytes]) -> Any:
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    key = local_key(address)  # the server's socket is CURVE: use its client key
    if key is not None:
        key.apply(sock)
    sock.connect(address)
    try:
        await sock.send_multipart(frames)
        reply = await asyncio.wait_for(sock.recv_multipart(), 10)
        return decode_envelope(reply[0], check_version=False)
    finally:
        sock.close()
        ctx.term()


async def test_server_answers_malformed_requests_and_keeps_serving() -> None:
    async with serving() as srv:
        bad = [
            ([b"\xc1garbage"], "malformed envelope"),
            ([msgspec.msgpack.encode({"not": "a list"})], "malformed envelope"),
            ([encode_envelope("health", "r"), b"extra"], "one envelope frame"),
            ([encode_envelope("launch", "r")], "unknown request kind"),
            ([encode_envelope("run", "r", {"task": [1, 2]})], "needs a task map"),
            ([encode_envelope("run_group", "r", {"task": {}, "r": 0})], "1 <= r"),
        ]
        for frames, message in bad:
            env = await _raw(srv.address, frames)
            assert env.kind == "error" and env.body["type"] == "ProtocolError", frames
            assert message in env.body["message"]
        async with client_of(srv) as client:
            assert (await client.health())["healthy"] is True
            res = await client.run({"turns": 1, "tokens": 3})
            assert len(res.episode.traces[0].nodes) == 2
        assert srv.counters["protocol_errors"] == len(bad)


async def test_other_protocol_or_schema_versions_are_refused_clearly() -> None:
    async with serving() as srv:
        env = await _raw(srv.address, [encode_envelope("hello", "h", schema=99)])
        assert env.kind == "error" and env.rid == "h"
        assert "schema 99" in env.body["message"]
        old = EnvClient(srv.address, protocol=PROTOCOL_VERSION - 1)
        try:
            with pytest.raises(ProtocolError, match=r"version mismatch.*upgrade"):
                await old.connect(timeout=10)
        finally:
            await old.close()


async def test_client_skips_malformed_frames_and_keeps_receiving() -> None:
    """A fake server answers with junk first; the client logs it and takes the real answer."""
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind("tcp://127.0.0.1:0")
    address = sock.getsockopt_string(zmq.LAST_ENDPOINT)
    client = EnvClient(address)

    async def fake_server() -> None:
        for _ in range(2):
            ident, req = await sock.recv_multipart()
            env = decode_envelope(req)
            junk = [
                [b"\x00\x01"],
                [encode_envelope("reply", "nobody-asked", {})],
                [encode_envelope("weird", env.rid, {})],
                [encode_envelope("reply", "someone-else", {}, proto=0)],
            ]
            for frames in junk:
                await sock.send_multipart([ident, *frames])
            if env.kind == "health":
                await sock.send_multipart([ident, encode_envelope("reply", env.rid,
                                                                  {"healthy": True})])
            else:
                # A run whose delta frames are corrupt: that run fails clearly.
                ep = Episode()
                ep.new_trace()
                d = EpisodeSender(ep).delta()
                assert d is not None
                frames = encode_frames(d)
                await sock.send_multipart([ident, encode_envelope("delta", env.rid, {"i": 0}),
                                           b"TW\x01\x00\xc1", *frames[1:]])

    server = asyncio.create_task(fake_server())
    try:
        assert await client.health(timeout=10) == {"healthy": True}
        with pytest.raises(ProtocolError):
            await client.run({"turns": 1}, timeout=10)
        await asyncio.wait_for(server, 10)
        # The receive side is still running: it still watches its socket.
        assert client._readers and all(not r.closed for r in client._readers.values())
    finally:
        server.cancel()
        await client.close()
        sock.close()
        ctx.term()
