"""The floor under serve's CURVE figures: a bare two-hop ZMQ relay, CURVE on or off.

A sender process streams ``count`` messages of ``size`` bytes through a relay process
(ROUTER in, ROUTER out: the broker's shape) to the bench process, the same bytes in the
same number of messages as one tracewire episode on the broker path. Nothing but pyzmq
and libzmq runs, so the CURVE-on/CURVE-off ratio here is what encrypting those bytes twice
costs on this machine; serve's own ratio is read against it.

    python bench/_zmq_floor.py relay|sender   (started by bench/serve.py --curve)
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from typing import Any

import zmq
import zmq.asyncio


def _secure(sock: zmq.Socket[Any], keys: dict[str, str], server: bool) -> None:
    if not keys:
        return
    if server:
        sock.curve_server = True
        sock.curve_secretkey = keys["server_secret"].encode()
    else:
        sock.curve_serverkey = keys["server_public"].encode()
        sock.curve_publickey = keys["client_public"].encode()
        sock.curve_secretkey = keys["client_secret"].encode()


def _keys_from_stdin() -> dict[str, str]:
    # Throwaway keys of this bench run; stdin keeps them off argv like the product does.
    line = sys.stdin.readline().split()
    if not line:
        return {}
    return dict(zip(("server_public", "server_secret", "client_public", "client_secret"),
                    line, strict=True))


def relay() -> None:
    """Forward every message from the sender side to the receiver that asked (and back)."""
    keys = _keys_from_stdin()
    ctx = zmq.Context()
    front, back = ctx.socket(zmq.ROUTER), ctx.socket(zmq.ROUTER)
    for s in (front, back):
        _secure(s, keys, server=True)
    front_port = front.bind_to_random_port("tcp://127.0.0.1")
    back_port = back.bind_to_random_port("tcp://127.0.0.1")
    print(front_port, back_port, flush=True)
    poller = zmq.Poller()
    poller.register(front, zmq.POLLIN)
    poller.register(back, zmq.POLLIN)
    sender, receiver = b"", b""
    while True:
        for sock, _ in poller.poll():
            parts = sock.recv_multipart(copy=False)
            if sock is front:  # the receiver: [id, request]
                receiver = parts[0].bytes
                if parts[1].bytes == b"stop":
                    return
                back.send_multipart([sender, parts[1]], copy=False)
            else:  # the sender: [id, b"hello"] once, then data for the receiver
                if not sender:
                    sender = parts[0].bytes
                    continue
                front.send_multipart([receiver, *parts[1:]], copy=False)


def sender(port: int) -> None:
    """On each request ``tag count size``, send that many messages of that many bytes."""
    keys = _keys_from_stdin()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    _secure(sock, keys, server=False)
    sock.connect(f"tcp://127.0.0.1:{port}")
    sock.send(b"hello")
    payloads: dict[int, bytes] = {}
    while True:
        tag, count, size = sock.recv().split()
        body = payloads.setdefault(int(size), bytes(int(size)))
        for _ in range(int(count) - 1):
            sock.send_multipart([tag, b"d", body], copy=False)
        sock.send_multipart([tag, b"e", body], copy=False)


class Floor:
    """One relay + sender pair (CURVE on or off) and a receiving socket in this process."""

    def __init__(self, curve: bool) -> None:
        keys = ""
        if curve:
            spub, ssec = zmq.curve_keypair()
            cpub, csec = zmq.curve_keypair()
            keys = b" ".join((spub, ssec, cpub, csec)).decode()
        self._procs: list[subprocess.Popen[str]] = []
        relay_p = self._spawn("relay", keys)
        assert relay_p.stdout is not None
        front, back = map(int, relay_p.stdout.readline().split())
        self._spawn(f"sender {back}", keys)
        self.pids = [p.pid for p in self._procs]
        self._ctx = zmq.asyncio.Context()
        self._sock = self._ctx.socket(zmq.DEALER)
        if keys:
            spub, _, cpub, csec = keys.split()
            _secure(self._sock, {"server_public": spub, "client_public": cpub,
                                 "client_secret": csec}, server=False)
        self._sock.connect(f"tcp://127.0.0.1:{front}")
        self._waiting: dict[bytes, asyncio.Future[None]] = {}
        self._reader = asyncio.ensure_future(self._read())
        self._tags = 0

    async def _read(self) -> None:
        while True:
            parts = await self._sock.recv_multipart(copy=False)
            if parts[1].bytes == b"e":
                self._waiting.pop(parts[0].bytes).set_result(None)

    def _spawn(self, args: str, keys: str) -> subprocess.Popen[str]:
        p = subprocess.Popen([sys.executable, __file__, *args.split()], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
        assert p.stdin is not None
        p.stdin.write(keys + "\n")
        p.stdin.flush()
        self._procs.append(p)
        return p

    async def episode(self, count: int, size: int) -> float:
        """Milliseconds from asking to holding all ``count`` messages."""
        self._tags += 1
        tag = str(self._tags).encode()
        done = self._waiting[tag] = asyncio.get_running_loop().create_future()
        t0 = time.perf_counter()
        await self._sock.send(b"%s %d %d" % (tag, count, size))
        await done
        return (time.perf_counter() - t0) * 1e3

    def close(self) -> None:
        """Stop the relay and sender."""
        self._reader.cancel()
        self._sock.send(b"stop")
        time.sleep(0.05)
        self._sock.close(linger=0)
        self._ctx.term()
        for p in self._procs:
            p.kill()
            p.wait()


if __name__ == "__main__":
    if sys.argv[1] == "relay":
        relay()
    else:
        sender(int(sys.argv[2]))
