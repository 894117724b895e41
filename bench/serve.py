"""Env server transport: tracewire serve vs. a pydantic + msgpack baseline over ZMQ.

Both sides run the same stand-in environment (N turns x 1,000 sampled tokens, no model) in
a server subprocess; the client (this process) asks over a DEALER socket and assembles the
streamed deltas. Ours: `tracewire serve standin` (broker + one worker process, delta frames
with raw column buffers, coalesced). Baseline: one ROUTER server process holding the episode
as pydantic models with Python lists; after every turn it re-dumps the trace (model_dump of
the node metadata, which grows with the episode) and sends the new nodes' token lists as
msgpack; the client validates each delta back into pydantic models.

    python bench/serve.py [--runs 5] [--episodes 400]

With ``--backend ray`` it compares instead the Ray worker backend ("ours") with the local
process backend ("baseline") in the same run: both `tracewire serve standin`, one worker
each, the same client; also the time from a worker's death (SIGKILL of the actor's process,
or of the worker process) to the client's ``WorkerDiedError``. Ray listens on every
interface it sees, so this mode runs only inside a network namespace holding just ``lo``:

    unshare --net -- sh -c 'ip link set lo up && exec python bench/serve.py --backend ray'

With ``--curve`` it measures what ZMQ CURVE (encryption and per-peer authentication on TCP
sockets, docs/CLUSTER.md) costs: two `tracewire serve standin` with a TCP worker endpoint,
one with CURVE (the default) and one with ``--no-curve``, the same client, runs interleaved;
both on the direct data path (the default on one host) and on the broker path (every token
byte crosses two CURVE sockets, as with remote workers). In the same run it measures the
floor (``_zmq_floor``): the broker path's messages, same count and size, through a bare
two-hop pyzmq relay with CURVE on and off, so what CURVE adds to ours reads against what it
adds to bytes that nothing but libzmq touches.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import zmq
import zmq.asyncio
from pydantic import BaseModel, Field

sys.path.insert(0, str(Path(__file__).parent))
from _common import emit
from _zmq_floor import Floor
from tracewire import WorkerDiedError
from tracewire.codec import record_bytes
from tracewire.serve import EnvClient

TOKENS = 1000


# -- baseline ----------------------------------------------------------------------------
class BNode(BaseModel):
    role: str
    content: str
    parent: int | None = None
    token_ids: list[int] = Field(default_factory=list)
    mask: list[int] = Field(default_factory=list)
    logprobs: list[float] = Field(default_factory=list)


class BCall(BaseModel):
    model: str
    finish_reason: str
    usage: dict[str, int]
    node: int


class BTrace(BaseModel):
    id: str
    nodes: list[BNode] = Field(default_factory=list)
    calls: list[BCall] = Field(default_factory=list)
    stop: str | None = None
    completed: bool = False
    rewards: dict[str, float] = Field(default_factory=dict)


_NODE_META = {"__all__": {"token_ids", "mask", "logprobs"}}


async def baseline_server(address: str) -> None:
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.bind(address)
    print(sock.getsockopt_string(zmq.LAST_ENDPOINT), flush=True)
    rng = np.random.default_rng(TOKENS)
    ids = rng.integers(0, 150_000, TOKENS, dtype=np.int32).tolist()
    lps = (-rng.random(TOKENS, dtype=np.float32)).tolist()

    async def run(ident: bytes, rid: bytes, turns: int) -> None:
        trace = BTrace(id=rid.decode())
        sent_nodes = sent_calls = 0
        parent = None
        for turn in range(turns):
            trace.nodes.append(BNode(role="user", content=f"turn {turn}", parent=parent,
                                     token_ids=list(range(8)), mask=[0] * 8,
                                     logprobs=[float("nan")] * 8))
            trace.nodes.append(BNode(role="assistant", content=f"answer {turn}",
                                     parent=len(trace.nodes) - 1, token_ids=list(ids),
                                     mask=[1] * TOKENS, logprobs=list(lps)))
            parent = len(trace.nodes) - 1
            trace.calls.append(BCall(model="standin", finish_reason="stop",
                                     usage={"completion_tokens": TOKENS}, node=parent))
            # Flush after each turn: re-dump the trace's structure, send what is new.
            snapshot = trace.model_dump(exclude={"nodes": _NODE_META})
            new_nodes = [n.model_dump() for n in trace.nodes[sent_nodes:]]
            delta = {"nodes": new_nodes, "calls": snapshot["calls"][sent_calls:],
                     "base": [sent_nodes, sent_calls], "stop": snapshot["stop"]}
            await sock.send_multipart([ident, rid, b"delta", msgpack.packb(delta)])
            sent_nodes, sent_calls = len(trace.nodes), len(trace.calls)
            await asyncio.sleep(0)
        trace.stop, trace.completed, trace.rewards = "max_turns", True, {"standin": 1.0}
        await sock.send_multipart([ident, rid, b"reply", msgpack.packb(
            {"nodes": len(trace.nodes), "calls": len(trace.calls), "stop": trace.stop,
             "completed": True, "rewards": trace.rewards})])

    tasks = set()
    while True:
        ident, rid, body = await sock.recv_multipart()
        t = asyncio.create_task(run(ident, rid, msgpack.unpackb(body)["turns"]))
        tasks.add(t)
        t.add_done_callback(tasks.discard)


class BaselineClient:
    def __init__(self, address: str) -> None:
        self.ctx = zmq.asyncio.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.connect(address)
        self.pending: dict[bytes, tuple[BTrace, asyncio.Future[tuple[BTrace, int]], list[int]]]
        self.pending = {}
        self.n = 0
        self.loop = asyncio.create_task(self._recv())

    async def _recv(self) -> None:
        while True:
            rid, kind, body = await self.sock.recv_multipart()
            trace, fut, wire = self.pending[rid]
            wire[0] += len(rid) + len(kind) + len(body)
            data = msgpack.unpackb(body)
            if kind == b"delta":
                if data["base"] != [len(trace.nodes), len(trace.calls)]:
                    fut.set_exception(RuntimeError("delta out of sequence"))
                trace.nodes.extend(BNode.model_validate(n) for n in data["nodes"])
                trace.calls.extend(BCall.model_validate(c) for c in data["calls"])
            else:
                assert data["nodes"] == len(trace.nodes) and data["calls"] == len(trace.calls)
                trace.stop, trace.completed = data["stop"], data["completed"]
                trace.rewards = data["rewards"]
                fut.set_result((trace, wire[0]))

    async def run(self, turns: int) -> tuple[BTrace, int]:
        self.n += 1
        rid = str(self.n).encode()
        fut: asyncio.Future[tuple[BTrace, int]] = asyncio.get_running_loop().create_future()
        self.pending[rid] = (BTrace(id=rid.decode()), fut, [0])
        await self.sock.send_multipart([rid, msgpack.packb({"turns": turns})])
        try:
            return await fut
        finally:
            del self.pending[rid]

    def close(self) -> None:
        self.loop.cancel()
        self.sock.close(0)
        self.ctx.term()


# -- measurement -------------------------------------------------------------------------
def _start(cmd: list[str], env: dict[str, str] | None = None
           ) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    address = line.split()[-1]
    if "tracewire" in cmd and "--no-curve" not in cmd:
        # A TCP server is CURVE: its second line names the client key file.
        key_line = proc.stdout.readline().split()
        assert key_line[:3] == ["client", "key", "file:"], key_line
        _KEYS[address] = key_line[3]
    return proc, address


_KEYS: dict[str, str] = {}


def _client(address: str, **kw: Any) -> EnvClient:
    return EnvClient(address, key_file=_KEYS.get(address), **kw)


async def _timed(fn: Any, runs: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(runs):
        out = None  # free the previous result before the clock starts, not inside the span
        t0 = time.perf_counter()
        out = await fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), out


async def _throughput(one: Any, episodes: int, inflight: int) -> float:
    left = [episodes]

    async def lane() -> None:
        while left[0] > 0:
            left[0] -= 1
            await one()

    t0 = time.perf_counter()
    await asyncio.gather(*(lane() for _ in range(inflight)))
    return episodes / (time.perf_counter() - t0)


async def main(runs: int, episodes: int, inline: bool, tune: bool) -> None:
    ours_proc, ours_addr = _start([sys.executable, "-m", "tracewire", "serve", "standin",
                                   "--address", "tcp://127.0.0.1:0",
                                   *(["--inline"] if inline else [])])
    base_proc, base_addr = _start([sys.executable, __file__, "--baseline-server",
                                   "tcp://127.0.0.1:0"])
    try:
        client = _client(ours_addr, tune_memory=tune)
        await client.connect(timeout=60)
        while not (await client.health())["healthy"]:
            await asyncio.sleep(0.05)
        base = BaselineClient(base_addr)

        async def ours_run(task: dict[str, int]) -> Any:
            # Received columns are copied in on first read: read them, so the episode the
            # round trip yields is one a trainer can use right away (the baseline's lists are).
            res = await client.run(task)
            for t in res.episode.traces:
                t.columns.arrays()
            return res

        for _ in range(3):  # warm up both paths
            await client.run({"turns": 10, "tokens": TOKENS})
            await base.run(10)
        for n in (10, 100, 1000):
            case, r = f"turns_{n}", max(1, runs if n < 1000 else (runs + 1) // 2)
            ours_ms, res = await _timed(lambda n=n: ours_run({"turns": n, "tokens": TOKENS}),
                                        runs)
            base_ms, (btrace, bwire) = await _timed(lambda n=n: base.run(n), r)
            assert len(res.episode.traces[0].nodes) == len(btrace.nodes) == 2 * n
            emit("serve", case, "round_trip_ms", "ms", ours_ms, base_ms, "lower", runs)
            emit("serve", case, "wire_bytes", "bytes", res.wire_bytes, bwire, "lower", 1)
            emit("serve", case, "record_bytes", "bytes", len(record_bytes(res.episode)), None,
                 "lower", 1)
        task = {"turns": 10, "tokens": TOKENS}
        ours_eps = statistics.median([await _throughput(lambda: ours_run(task), episodes, 4)
                                      for _ in range(3)])
        base_eps = statistics.median([await _throughput(lambda: base.run(10), episodes, 4)
                                      for _ in range(3)])
        emit("serve", "ten_turn_episodes_4_inflight", "episodes_per_s", "1/s", ours_eps,
             base_eps, "higher", 3)
        base.close()
        await client.close()
    finally:
        for p in (ours_proc, base_proc):
            p.terminate()
            p.wait(timeout=30)


def _only_loopback() -> None:
    names = [name for _, name in socket.if_nameindex()]
    if names != ["lo"]:
        sys.exit(f"refusing to start Ray with interfaces {names}: run inside a network "
                 "namespace holding only lo (see this script's docstring)")


async def _wait_healthy(client: EnvClient) -> None:
    await client.connect(timeout=300)
    while not (await client.health())["healthy"]:
        await asyncio.sleep(0.05)


async def _death_ms(client: EnvClient) -> float:
    """Kill the busy worker's process mid-episode; ms until the client hears of it."""
    first = asyncio.Event()
    run = asyncio.create_task(client.run({"turns": 4000, "tokens": 10, "delay": 0.01},
                                         on_delta=lambda d, e: first.set()))
    await asyncio.wait_for(first.wait(), 60)
    (pid,) = [w["pid"] for w in (await client.stats())["workers"] if w["load"]]
    t0 = time.perf_counter()
    os.kill(pid, signal.SIGKILL)
    try:
        await asyncio.wait_for(run, 60)
    except WorkerDiedError:
        ms = (time.perf_counter() - t0) * 1e3
    else:
        raise AssertionError("the run survived its worker")
    while (await client.health())["workers_live"] < 1:  # wait for the replacement
        await asyncio.sleep(0.05)
    return ms


async def main_backends(runs: int, episodes: int) -> None:
    _only_loopback()
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    ray_proc, ray_addr = _start([sys.executable, "-m", "tracewire", "serve", "standin",
                                 "--address", "tcp://127.0.0.1:0", "--backend", "ray"], env)
    proc_proc, proc_addr = _start([sys.executable, "-m", "tracewire", "serve", "standin",
                                   "--address", "tcp://127.0.0.1:0"])
    try:
        ray_c, proc_c = _client(ray_addr), _client(proc_addr)
        broker_c = _client(proc_addr, direct=False)
        for c in (ray_c, proc_c, broker_c):
            await _wait_healthy(c)

        big, small = {"turns": 1000, "tokens": TOKENS}, {"turns": 10, "tokens": TOKENS}
        clients = {"ray": ray_c, "process": proc_c, "broker": broker_c}
        for c in clients.values():
            for _ in range(3):
                await one(c, small)
        # Interleaved (ray, process, broker path, ray, ...) so load from other processes on
        # the machine falls on all three alike.
        rt: dict[str, list[float]] = {k: [] for k in clients}
        for _ in range(runs):
            for name, c in clients.items():
                ms, res = await _timed(lambda c=c: one(c, big), 1)
                assert len(res.episode.traces[0].nodes) == 2000
                rt[name].append(ms)
        med = {k: statistics.median(v) for k, v in rt.items()}
        emit("serve_ray", "turns_1000_vs_process", "round_trip_ms", "ms", med["ray"],
             med["process"], "lower", runs)
        emit("serve_ray", "turns_1000_vs_process_broker_path", "round_trip_ms", "ms",
             med["ray"], med["broker"], "lower", runs)
        tp: dict[str, list[float]] = {k: [] for k in clients}
        for _ in range(3):
            for name, c in clients.items():
                tp[name].append(await _throughput(lambda c=c: one(c, small), episodes, 4))
        eps = {k: statistics.median(v) for k, v in tp.items()}
        emit("serve_ray", "ten_turn_episodes_4_inflight_vs_process", "episodes_per_s", "1/s",
             eps["ray"], eps["process"], "higher", 3)
        emit("serve_ray", "ten_turn_episodes_4_inflight_vs_process_broker_path",
             "episodes_per_s", "1/s", eps["ray"], eps["broker"], "higher", 3)
        ray_death = statistics.median([await _death_ms(ray_c) for _ in range(3)])
        proc_death = statistics.median([await _death_ms(proc_c) for _ in range(3)])
        emit("serve_ray", "worker_death_to_client_error", "ms", "ms", ray_death, proc_death,
             "lower", 3)
        for c in (ray_c, proc_c, broker_c):
            await c.close()
    finally:
        for p in (ray_proc, proc_proc):
            p.terminate()
            p.wait(timeout=60)


async def one(client: EnvClient, task: dict[str, int]) -> Any:
    """One episode of ``task``, its token columns materialised (what a trainer reads)."""
    res = await client.run(task)
    for t in res.episode.traces:
        t.columns.arrays()
    return res


def _cpu_s(pids: list[int]) -> float:
    """CPU seconds (user + system) the processes ``pids`` have used so far."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


async def _message_shape(client: EnvClient, task: dict[str, int]) -> tuple[int, int]:
    """(messages, bytes per message) one episode of ``task`` takes from worker to client."""
    seen = [0, 0, 0]
    # Counting only: the bench wraps the client's per-message hook on this one instance.
    inner = client._on_message

    def count(addr: str, frames: list[Any]) -> None:
        seen[0] += 1
        seen[1] += sum(f.buffer.nbytes for f in frames)
        seen[2] += len(frames)
        inner(addr, frames)

    client._on_message = count  # type: ignore[method-assign]
    try:
        await one(client, task)
    finally:
        del client._on_message
    print(f"# {task}: {seen[2]} frames in {seen[0]} messages", file=sys.stderr)
    return seen[0], max(1, seen[1] // max(1, seen[0]))


def _emit_vs_floor(case: str, metric: str, ours: float, floor: float, runs: int) -> None:
    """What CURVE adds to ours beside what it adds to the bare relay (ratio > 1: we add less)."""
    emit("serve_curve", case, metric, "ms" if metric.endswith("_ms") else "us", ours, floor,
         "lower", runs)


async def main_curve(runs: int, episodes: int) -> None:
    serve = [sys.executable, "-m", "tracewire", "serve", "standin", "--address",
             "tcp://127.0.0.1:0", "--worker-address", "tcp://127.0.0.1:0"]
    curve_proc, curve_addr = _start(serve)
    plain_proc, plain_addr = _start([*serve, "--no-curve"])
    floors: dict[str, Floor] = {}
    try:
        clients = {"curve": _client(curve_addr), "plain": _client(plain_addr),
                   "curve_broker": _client(curve_addr, direct=False),
                   "plain_broker": _client(plain_addr, direct=False)}
        for c in clients.values():
            await _wait_healthy(c)
        assert (await clients["curve"].health())["curve"] == {"clients": True, "workers": True}
        assert (await clients["plain"].health())["curve"] == {"clients": False,
                                                              "workers": False}

        big, small = {"turns": 1000, "tokens": TOKENS}, {"turns": 10, "tokens": TOKENS}
        for c in clients.values():
            for _ in range(3):
                await one(c, small)
        shape = {name: await _message_shape(clients["plain_broker"], task)
                 for name, task in (("big", big), ("small", small))}
        print("# message shape (messages, bytes each):", shape, file=sys.stderr)
        floors["floor_curve"], floors["floor_plain"] = Floor(curve=True), Floor(curve=False)
        # Server side: the broker process and its worker processes.
        procs = {"curve": curve_proc.pid, "plain": plain_proc.pid}
        pids: dict[str, list[int]] = {}
        for name, c in clients.items():
            workers = [w["pid"] for w in (await c.stats())["workers"]]
            pids[name] = [procs[name.split("_")[0]], *workers]
        rt: dict[str, list[float]] = {k: [] for k in clients}
        cpu: dict[str, float] = dict.fromkeys(clients, 0.0)
        for _ in range(runs):  # interleaved, so other load falls on all alike
            for name, c in clients.items():
                before = _cpu_s(pids[name]) + time.process_time()
                ms, res = await _timed(lambda c=c: one(c, big), 1)
                cpu[name] += _cpu_s(pids[name]) + time.process_time() - before
                assert len(res.episode.traces[0].nodes) == 2000
                rt[name].append(ms)
            for name, f in floors.items():
                before = _cpu_s(f.pids) + time.process_time()
                rt.setdefault(name, []).append(await f.episode(*shape["big"]))
                cpu[name] = cpu.get(name, 0.0) + _cpu_s(f.pids) + time.process_time() - before
        med = {k: statistics.median(v) for k, v in rt.items()}
        for path, sfx in (("", "direct"), ("_broker", "broker_path")):
            emit("serve_curve", f"turns_1000_{sfx}", "cpu_ms_per_episode", "ms",
                 cpu[f"curve{path}"] / runs * 1e3, cpu[f"plain{path}"] / runs * 1e3, "lower",
                 runs)
        emit("serve_curve", "turns_1000_direct", "round_trip_ms", "ms", med["curve"],
             med["plain"], "lower", runs)
        emit("serve_curve", "turns_1000_broker_path", "round_trip_ms", "ms",
             med["curve_broker"], med["plain_broker"], "lower", runs)
        # The floor: the same bytes in the same messages through a bare two-hop relay.
        emit("serve_curve", "turns_1000_floor_relay", "round_trip_ms", "ms",
             med["floor_curve"], med["floor_plain"], "lower", runs)
        emit("serve_curve", "turns_1000_floor_relay", "cpu_ms_per_episode", "ms",
             cpu["floor_curve"] / runs * 1e3, cpu["floor_plain"] / runs * 1e3, "lower", runs)
        _emit_vs_floor("turns_1000_broker_path_vs_floor", "curve_added_round_trip_ms",
                       med["curve_broker"] - med["plain_broker"],
                       med["floor_curve"] - med["floor_plain"], runs)
        tp: dict[str, list[float]] = {k: [] for k in clients}
        for _ in range(runs):
            for name, c in clients.items():
                tp[name].append(await _throughput(lambda c=c: one(c, small), episodes, 4))
            for name, f in floors.items():
                tp.setdefault(name, []).append(
                    await _throughput(lambda f=f: f.episode(*shape["small"]), episodes, 4))
        eps = {k: statistics.median(v) for k, v in tp.items()}
        emit("serve_curve", "ten_turn_episodes_4_inflight_floor_relay", "episodes_per_s",
             "1/s", eps["floor_curve"], eps["floor_plain"], "higher", runs)
        _emit_vs_floor("ten_turn_episodes_broker_path_vs_floor", "curve_added_us_per_episode",
                       1e6 / eps["curve_broker"] - 1e6 / eps["plain_broker"],
                       1e6 / eps["floor_curve"] - 1e6 / eps["floor_plain"], runs)
        emit("serve_curve", "ten_turn_episodes_4_inflight_direct", "episodes_per_s", "1/s",
             eps["curve"], eps["plain"], "higher", runs)
        emit("serve_curve", "ten_turn_episodes_4_inflight_broker_path", "episodes_per_s",
             "1/s", eps["curve_broker"], eps["plain_broker"], "higher", runs)
        for c in clients.values():
            await c.close()
    finally:
        for f in floors.values():
            f.close()
        for p in (curve_proc, plain_proc):
            p.terminate()
            p.wait(timeout=30)


if __name__ == "__main__":
    # The client process freezes its start-up objects, as recommended for long-running
    # processes (docs/ARCHITECTURE.md) and done by tracewire's own (cli.main).
    gc.freeze()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--episodes", type=int, default=400)
    ap.add_argument("--inline", action="store_true",
                    help="serve with workers inside the server process (tracewire serve --inline)")
    ap.add_argument("--untuned-client", action="store_true",
                    help="EnvClient(tune_memory=False): leave this process's allocator alone")
    ap.add_argument("--backend", choices=["process", "ray"], default="process",
                    help="ray: Ray backend vs process backend (inside a netns, see above)")
    ap.add_argument("--curve", action="store_true",
                    help="CURVE on vs off (TCP worker endpoint), direct and broker paths")
    ap.add_argument("--baseline-server", metavar="ADDRESS", default=None)
    a = ap.parse_args()
    if a.baseline_server:
        asyncio.run(baseline_server(a.baseline_server))
    elif a.curve:
        asyncio.run(main_curve(a.runs, a.episodes))
    elif a.backend == "ray":
        asyncio.run(main_backends(a.runs, a.episodes))
    else:
        asyncio.run(main(a.runs, a.episodes, a.inline, not a.untuned_client))
