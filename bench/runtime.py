"""Runtimes: what a sandbox costs per rollout, and what the relay adds per request.

Cases:
- ``startup_teardown``: boot, one ``/bin/true`` exec, and close of a runtime, as a rollout
  pays them. Ours: ``bwrap`` (with its relay and cgroup); baseline: ``local`` (a host
  subprocess in a temp dir, today's behaviour). A ratio below 1 is the price of the sandbox.
- ``relay_round_trip``: keep-alive HTTP clients (stdlib ``http.client``) send small
  requests to the proxy session (``GET …/v1/models``, answered by the proxy itself, so the
  figure is transport, not model). ``round_trip_p50_ms``: ours from inside bwrap through
  the in-sandbox TCP listener, the Unix socket and the filtering relay; baseline the same
  client on the host straight to the proxy's TCP port. On a loaded machine those two
  medians drift apart by more than the relay costs, so ``relay_added_ms`` is the sum of two
  paired figures, each the median per-request difference between two connections used
  alternately by one client: host relay (direct TCP vs the relay's Unix socket, on the
  host) and sandbox hop (that socket vs the in-sandbox TCP listener, inside bwrap).

    python bench/runtime.py [--runs 5] [--requests 400]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _common import emit
from tracewire.model import ModelServer
from tracewire.proxy import Proxy
from tracewire.runtime import BwrapRuntime, LocalRuntime, ProxyEndpoint, Runtime, bwrap_usable

#: The interpreter itself (bwrap binds its prefix; the venv is not needed by the client).
PYTHON = str(Path(sys.executable).resolve())
CLIENT = r"""
import http.client, json, os, socket, statistics, sys, time

class Unix(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("localhost")
        self.path_ = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.path_)

n, path, targets = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
conns = [Unix(t[5:]) if t.startswith("unix:") else
         http.client.HTTPConnection("127.0.0.1", int(t[4:])) for t in targets]
h = {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]}
times = [[] for _ in conns]
for i in range(n + 20):
    # Interleaved, so load drift hits every path alike, and in alternating order (ABBA),
    # since the first request after a pause finds the proxy's loop asleep.
    pairs = list(zip(conns, times))
    for c, ts in pairs if i % 2 else pairs[::-1]:
        t0 = time.perf_counter_ns()
        c.request("GET", path, headers=h)
        r = c.getresponse()
        r.read()
        if r.status != 200:
            raise SystemExit(f"status {r.status}")
        if i >= 20:  # warm-up: first connection, first route lookups
            ts.append(time.perf_counter_ns() - t0)
med = [statistics.median(ts) / 1e3 for ts in times]
diff = [statistics.median(b - a for a, b in zip(times[0], ts)) / 1e3 for ts in times]
print(json.dumps({"p50_us": med, "paired_diff_us": diff}))
"""


async def _lifecycle(make: Any) -> dict[str, float]:
    phases: dict[str, float] = {}

    def hook(name: str, t0: float, t1: float) -> None:
        phases[name] = (t1 - t0) * 1e3

    t0 = time.perf_counter()
    rt: Runtime = make(hook)
    async with rt:
        res = await rt.exec(["/bin/true"], timeout=60)
        assert res.ok, res.to_info()
    phases["total"] = (time.perf_counter() - t0) * 1e3
    return phases


async def startup_teardown(proxy: Proxy, runs: int) -> None:
    ep = ProxyEndpoint.from_session(proxy.create_session())
    makers = {
        "bwrap": lambda hook: BwrapRuntime(endpoint=ep, on_phase=hook),
        "local": lambda hook: LocalRuntime(endpoint=ep, on_phase=hook),
    }
    got: dict[str, list[dict[str, float]]] = {"bwrap": [], "local": []}
    for _ in range(runs):
        for name, make in makers.items():  # interleaved, so load drifts hit both alike
            got[name].append(await _lifecycle(make))
    for metric, phase in (("boot_ms", "boot"), ("exec_true_ms", "exec"),
                          ("close_ms", "close"), ("rollout_overhead_ms", "total")):
        ours = statistics.median(r[phase] for r in got["bwrap"])
        base = statistics.median(r[phase] for r in got["local"])
        emit("runtime", "startup_teardown", metric, "ms", ours, base, "lower", runs)


async def _client(rt: Runtime, ep: ProxyEndpoint, n: int, targets: list[str]
                  ) -> dict[str, list[float]]:
    await rt.put_files({"client.py": CLIENT})
    res = await rt.exec([PYTHON, "client.py", str(n), f"/sessions/{ep.id}/v1/models",
                         *targets], timeout=300)
    assert res.ok, res.to_info()
    return dict(json.loads(res.stdout))


async def relay_round_trip(proxy: Proxy, runs: int, n: int) -> None:
    """Two paired measurements, each interleaving two paths request by request: on the
    host, direct TCP vs the host relay's Unix socket (the filtering relay's cost); in the
    sandbox, that Unix socket vs the in-sandbox TCP listener (the launcher's hop)."""
    ep = ProxyEndpoint.from_session(proxy.create_session())
    host: list[dict[str, list[float]]] = []
    box: list[dict[str, list[float]]] = []
    async with BwrapRuntime(endpoint=ep) as boxed, LocalRuntime(endpoint=ep) as local:
        assert boxed.relay is not None
        sock = boxed.relay.socket_path
        for _ in range(runs):
            host.append(await _client(local, ep, n, [f"tcp:{ep.port}", f"unix:{sock}"]))
            box.append(await _client(boxed, ep, n, ["unix:/run/tracewire/proxy.sock",
                                                     f"tcp:{ep.port}"]))
    direct = statistics.median(r["p50_us"][0] for r in host) / 1e3
    full = statistics.median(r["p50_us"][1] for r in box) / 1e3
    emit("runtime", "relay_round_trip", "round_trip_p50_ms", "ms", full, direct, "lower", runs)
    outer = statistics.median(r["paired_diff_us"][1] for r in host) / 1e3
    inner = statistics.median(r["paired_diff_us"][1] for r in box) / 1e3
    emit("runtime", "relay_round_trip", "host_relay_added_ms", "ms", outer, None, "lower", runs)
    emit("runtime", "relay_round_trip", "sandbox_hop_added_ms", "ms", inner, None, "lower",
         runs)
    emit("runtime", "relay_round_trip", "relay_added_ms", "ms", outer + inner, None, "lower",
         runs)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--requests", type=int, default=400)
    args = ap.parse_args()
    reason = await bwrap_usable()
    if reason is not None:
        print(json.dumps({"bench": "runtime", "skipped": reason}))
        return
    async with ModelServer() as model, Proxy(model.base_url) as proxy:
        await startup_teardown(proxy, args.runs)
        await relay_round_trip(proxy, args.runs, args.requests)


if __name__ == "__main__":
    asyncio.run(main())
