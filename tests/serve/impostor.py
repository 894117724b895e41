"""An attacker on the broker's host, run as its own process by the trust tests.

It reads every given process's ``/proc/PID/cmdline`` and ``environ``, tries every
40-character Z85 word found there as a CURVE secret key, and connects to the worker endpoint
as every worker id it was told (and some it made up): with no key, with fresh random keys,
with the words it found and with any keys handed to it. Each connection says ``ready``,
then keeps sending forged replies for job ids 1..50 until its standard input closes; any
``run`` it is given is answered with a forged reward. It prints one JSON line: what it read
and how many jobs it got.

    python tests/serve/impostor.py '{"endpoint": ..., "pids": [...], "ids": [...], ...}'
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

import zmq

from tracewire.serve._protocol import JobKind, decode_envelope, encode_envelope, job_frame

_Z85 = re.compile(rb"[0-9a-zA-Z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}")


def read_proc(pids: list[int]) -> dict[str, str]:
    seen: dict[str, str] = {}
    for pid in pids:
        for part in ("cmdline", "environ"):
            try:
                with open(f"/proc/{pid}/{part}", "rb") as f:
                    seen[f"{pid}/{part}"] = f.read().decode("latin-1")
            except OSError as exc:
                seen[f"{pid}/{part}"] = f"<{exc}>"
    return seen


def sockets(ctx: zmq.Context[Any], cfg: dict[str, Any], words: list[bytes]) -> list[Any]:
    ids = [*cfg["ids"], "w1-0000", "w2-0001", "w3-ffff"]
    server_key = cfg.get("server_key", "").encode()
    out = []

    def dealer(wid: str, secret: bytes | None, public: bytes | None = None) -> None:
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.RECONNECT_IVL, 500)  # a refused handshake is retried, not stormed
        s.setsockopt(zmq.ROUTING_ID, wid.encode())
        if secret is not None and server_key:
            s.curve_secretkey = secret
            s.curve_publickey = public or zmq.curve_public(secret)
            s.curve_serverkey = server_key
        s.connect(cfg["endpoint"])
        out.append(s)

    for wid in ids:
        dealer(wid, None)
        dealer(wid, zmq.curve_keypair()[1])
        for w in words[:8]:
            try:
                dealer(wid, w)
            except (zmq.ZMQError, ValueError):
                pass
    for stolen in cfg.get("keys", []):
        dealer(stolen["id"], stolen["secret"].encode(), stolen["public"].encode())
    return out


def forge(s: Any) -> None:
    try:
        s.send_multipart([b"", encode_envelope("ready", "", {"pid": 1})], zmq.NOBLOCK)
        for jid in range(1, 51):
            s.send_multipart([job_frame(jid, JobKind.REPLY),
                              encode_envelope("reply", "forged", {"i": 0, "reward": 1337}),
                              b"forged"], zmq.NOBLOCK)
    except zmq.ZMQError:
        pass  # queue full or not connected: try again next round


def main() -> None:
    cfg = json.loads(sys.argv[1])
    seen = read_proc(cfg.get("pids", []))
    words = sorted({w for text in seen.values() for w in _Z85.findall(text.encode("latin-1"))})
    ctx: zmq.Context[Any] = zmq.Context()
    socks = sockets(ctx, cfg, words)
    poller = zmq.Poller()
    for s in socks:
        poller.register(s, zmq.POLLIN)
    poller.register(sys.stdin.fileno(), zmq.POLLIN)
    jobs = messages = 0
    done = False
    while not done:
        for s in socks:
            forge(s)
        for item, _ in poller.poll(100):
            if item == sys.stdin.fileno():
                done = True
                continue
            frames = item.recv_multipart()
            messages += 1
            env = decode_envelope(frames[-1], check_version=False)
            if env.kind == "run":
                jobs += 1
                item.send_multipart([job_frame(int(env.body["job"]), JobKind.REPLY),
                                     encode_envelope("reply", env.rid, {"reward": 1337})])
    for s in socks:
        s.close(0)
    ctx.term()
    print(json.dumps({"jobs": jobs, "messages": messages, "sockets": len(socks),
                      "words": len(words), "seen": seen}), flush=True)


if __name__ == "__main__":
    main()
