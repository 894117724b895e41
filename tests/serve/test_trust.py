"""Only the workers and clients the broker made keys for get in (real processes, real CURVE).

An impostor on the same host (tests/serve/impostor.py, its own process) reads the workers'
command lines and environments and connects to a TCP worker endpoint as any id it likes; it
must get no job and no frame of its reaches a client. A dead worker's slot and key open
nothing; a worker being killed gets no new job; the client socket admits only key holders.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import stat
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from tracewire import ServeError
from tracewire.codec import encode_frames
from tracewire.serve import EnvClient, EnvServer, LocalProcessPool, ServerConfig, WorkerHandle
from tracewire.serve._auth import (
    ClientKey,
    KeyPair,
    read_key_file,
    unregister_local,
    write_key_file,
)
from tracewire.serve._config import WorkerConfig
from tracewire.serve._pool import ProcessHandle
from tracewire.serve._protocol import encode_envelope
from tracewire.trace import Episode

from .conftest import ADDRESS, until

ROOT = Path(__file__).resolve().parents[2]
IMPOSTOR = Path(__file__).with_name("impostor.py")
TCP = "tcp://127.0.0.1:0"
RUNNERS = "tests.serve._trust_runners:stubborn_or_standin"
# Worker processes import the test runner from the checkout.
PYTHONPATH = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))


class RecordingPool(LocalProcessPool):
    """The real process pool; it also keeps each worker's config, so a test knows the
    secrets that must not leak (and can play a thief who stole one)."""

    def __init__(self, hang: int = 0) -> None:
        super().__init__(env={"PYTHONPATH": PYTHONPATH})
        self.configs: dict[str, WorkerConfig] = {}
        self._hang = hang

    async def start(self, config: WorkerConfig) -> WorkerHandle:
        self.configs[config.worker_id] = config
        if len(self.configs) <= self._hang:
            # A worker still loading its model: a real process that never connects.
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-c", "import time; time.sleep(600)")
            return ProcessHandle(proc)
        return await super().start(config)


@contextlib.asynccontextmanager
async def server(pool: LocalProcessPool, ready: int | None = None,
                 **config: Any) -> AsyncIterator[EnvServer]:
    srv = EnvServer("standin", address=ADDRESS, factory=RUNNERS, pool=pool,
                    config=ServerConfig(**{"worker_endpoint": TCP, **config}))
    await srv.start()
    try:
        await srv.wait_ready(ready, timeout=60)
        yield srv
    finally:
        await srv.stop(drain=False, timeout=5)


@contextlib.asynccontextmanager
async def impostor(srv: EnvServer, ids: list[str], keys: list[dict[str, str]] | None = None,
                   ) -> AsyncIterator[dict[str, Any]]:
    """Run the impostor against ``srv`` for the block; its report fills the yielded dict."""
    assert srv.client_key is not None
    pids = [w.pid for w in srv.workers.all.values() if w.pid is not None]
    cfg = {"endpoint": srv.worker_endpoint, "pids": pids, "ids": ids,
           # The server's public key is no secret: assume the attacker has it.
           "server_key": srv.client_key.server_key, "keys": keys or []}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(IMPOSTOR), json.dumps(cfg), stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE)
    report: dict[str, Any] = {}
    try:
        yield report
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
        report.update(json.loads(out))


def refused(srv: EnvServer) -> int:
    """Worker handshakes the broker refused (unknown key, or no CURVE at all)."""
    denied = srv.stats()["handshakes_denied"].get("workers", 0)
    return int(srv.counters["worker_handshakes_failed"]) + int(denied)


def assert_genuine(episodes: list[Episode]) -> None:
    for ep in episodes:
        (trace,) = ep.traces
        assert trace.completed
        assert {k: r.score for k, r in trace.rewards.items()} == {"standin": 1.0}


async def test_impostor_reading_proc_gets_no_job_and_injects_no_frame() -> None:
    pool = RecordingPool()
    async with server(pool, workers=2) as srv, EnvClient(srv.address) as client:
        assert srv.health()["curve"] == {"clients": True, "workers": True}
        ids = list(srv.workers.all)
        async with impostor(srv, ids) as report:
            await until(lambda: refused(srv) >= 4, "the impostor's handshakes to be refused")
            results = [await client.run({"turns": 3, "tokens": 20}) for _ in range(5)]
            results += await client.run_group({"turns": 2, "tokens": 10}, 4)
            await until(lambda: refused(srv) >= 8, "more refused handshakes")
        assert report["jobs"] == report["messages"] == 0
        assert_genuine([r.episode for r in results])
        # Episode data went straight to the client: nothing, forged replies included, was
        # forwarded by the broker (a forged frame for an open job id would have been).
        assert srv.counters["bytes_forwarded"] == 0
        # (DONE reaches the broker just after the direct reply reached the client.)
        await until(lambda: srv.counters["episodes_ok"] == 9, "the broker to count the runs")
        assert srv.counters["episodes_failed"] == 0
        assert sorted(srv.workers.all) == sorted(ids)
    seen = report["seen"]
    cmdlines = [v for k, v in seen.items() if k.endswith("cmdline")]
    assert len(cmdlines) == 2 and all("tracewire.serve._worker" in c for c in cmdlines)
    assert all(not v.startswith("<") for v in seen.values())  # it could read them all
    for cfg in pool.configs.values():
        assert cfg.secret_key and all(cfg.secret_key not in v for v in seen.values())
        assert all(cfg.worker_id not in v for v in seen.values())


async def test_a_stolen_key_speaks_only_as_its_own_worker() -> None:
    # The second worker never connects (still "loading"): a thief holding the first
    # worker's keys takes the second's id, which the router would accept.
    pool = RecordingPool(hang=1)
    async with server(pool, ready=1, workers=2, max_workers=2) as srv, \
            EnvClient(srv.address) as client:
        loading = next(w for w in srv.workers.all.values() if w.state == "starting")
        ready = next(w for w in srv.workers.all.values() if w.state == "ready")
        stolen = pool.configs[ready.id]
        keys = [{"id": loading.id, "public": stolen.public_key, "secret": stolen.secret_key}]
        async with impostor(srv, [], keys) as report:
            await until(lambda: srv.counters["frames_dropped"] > 0, "its frames to be dropped")
            results = await client.run_group({"turns": 2, "tokens": 10}, 3)
        assert loading.state == "starting"  # its forged "ready" counted for nothing
        assert report["jobs"] == report["messages"] == 0
        assert_genuine([r.episode for r in results])
        assert srv.counters["bytes_forwarded"] == 0
        assert srv.stats()["frames_dropped"] > 0


async def test_a_dead_workers_slot_and_key_open_nothing() -> None:
    pool = RecordingPool()
    async with server(pool, workers=1) as srv, EnvClient(srv.address) as client:
        (dead,) = srv.workers.all.values()
        cfg = pool.configs[dead.id]
        assert dead.pid is not None
        os.kill(dead.pid, signal.SIGKILL)
        await until(lambda: dead.id not in srv.workers.all, "the death to be noticed")
        keys = [{"id": dead.id, "public": cfg.public_key, "secret": cfg.secret_key}]
        async with impostor(srv, [dead.id], keys) as report:
            # Its own key is refused now, as are the keyless and random-key attempts.
            await until(lambda: srv.stats()["handshakes_denied"]["workers"] >= 2,
                        "the dead worker's key to be refused")
            await srv.wait_ready(1, timeout=60)
            results = [await client.run({"turns": 2, "tokens": 10}) for _ in range(3)]
        assert report["jobs"] == report["messages"] == 0
        assert_genuine([r.episode for r in results])
        (fresh,) = srv.workers.all
        assert fresh != dead.id and srv.counters["bytes_forwarded"] == 0


class LateKillPool(LocalProcessPool):
    """Real worker processes whose kill lands a second late, as a Ray actor's does (the kill
    is a request to the cluster): the window in which a doomed worker must get no job."""

    def __init__(self) -> None:
        super().__init__(env={"PYTHONPATH": PYTHONPATH})

    async def start(self, config: WorkerConfig) -> WorkerHandle:
        handle = await super().start(config)
        assert isinstance(handle, ProcessHandle)
        return _LateKill(handle)


class _LateKill(WorkerHandle):
    def __init__(self, inner: ProcessHandle) -> None:
        self.inner = inner
        self.pid = inner.pid

    async def wait(self) -> int:
        return await self.inner.wait()

    def kill(self) -> None:
        asyncio.get_running_loop().call_later(1.0, self.inner.kill)

    def terminate(self) -> None:
        self.inner.terminate()


async def test_a_worker_being_killed_gets_no_new_job() -> None:
    pool = LateKillPool()
    async with server(pool, workers=1, max_workers=2, max_inflight=4, cancel_grace=0.3) as srv, \
            EnvClient(srv.address) as client:
        (doomed,) = srv.workers.all.values()
        stuck = asyncio.create_task(client.run({"stubborn": True}, request_id="stuck"))
        await until(lambda: srv.inflight == 1, "the stubborn run to start")
        assert await client.cancel("stuck") == 1
        with pytest.raises(ServeError, match="cancelled"):
            await stuck
        # It ignores the cancel: after the grace it is killed, and dies a second later.
        await until(lambda: srv.counters["workers_unresponsive"] == 1, "the kill")
        assert doomed.state == "killing" and srv.workers.least_loaded() is not doomed
        # Before, this went to the doomed worker and failed with WorkerDiedError.
        res = await client.run({"turns": 2, "tokens": 10})
        assert_genuine([res.episode])
        (fresh,) = [w for w in srv.workers.all.values() if w is not doomed]
        # The reply came on the direct path; the broker hears DONE a moment later.
        await until(lambda: fresh.done == 1, "the broker to count the run")
        assert doomed.done == 0
        await until(lambda: doomed.id not in srv.workers.all, "the late kill to land")
        assert srv.workers.deaths == 1
        assert srv.health()["last_worker_error"] == (
            f"worker {doomed.id} (pid {doomed.pid}) killed: did not stop a cancelled episode "
            "within 0.3s")
        assert srv.counters["episodes_failed"] == 1  # the cancelled one only


async def connect_once(client: EnvClient) -> None:
    try:
        await client.connect(timeout=1.0)
    finally:
        await client.close()


async def client_with(srv: EnvServer, tmp_path: Path, pair: KeyPair) -> int:
    """Run one episode as a client holding ``pair``; the number of nodes it got."""
    assert srv.client_key is not None
    own = tmp_path / "own.key"
    write_key_file(own, ClientKey(server_key=srv.client_key.server_key, public=pair.public,
                                  secret=pair.secret))
    async with EnvClient(srv.address, key_file=own) as client:
        res = await client.run({"turns": 1, "tokens": 3})
    return len(res.episode.traces[0].nodes)


async def test_client_socket_admits_only_holders_of_the_servers_key(tmp_path: Path) -> None:
    key_file = tmp_path / "keys" / "client.key"
    key_file.parent.mkdir(mode=0o700)
    extra = KeyPair.new()
    async with server(LocalProcessPool(), workers=1, client_key_file=str(key_file),
                      client_keys=[extra.public]) as srv:
        assert srv.client_key_file == str(key_file)
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        key = read_key_file(key_file)
        assert key.address == srv.address and key.server_key == srv.client_key.server_key
        async with EnvClient(srv.address, key_file=key_file) as client:
            res = await client.run({"turns": 2, "tokens": 10})
        assert_genuine([res.episode])
        # A client with a key of its own making (and the server's public key) is refused.
        forged = tmp_path / "forged.key"
        pair = KeyPair.new()
        forged.write_bytes(key_file.read_bytes().replace(key.secret.encode(),
                                                         pair.secret.encode())
                           .replace(key.public.encode(), pair.public.encode()))
        forged.chmod(0o600)
        with pytest.raises(ServeError, match="TRACEWIRE_CLIENT_KEY_FILE"):
            await connect_once(EnvClient(srv.address, key_file=forged))
        # And so is one with no key at all (the in-process lookup removed for this).
        unregister_local(srv.address)
        with pytest.raises(ServeError, match="admits only clients holding its key"):
            await connect_once(EnvClient(srv.address))
        assert srv.stats()["handshakes_denied"]["clients"] >= 1
        assert srv.counters["client_handshakes_failed"] >= 2
        # A key the operator authorised (ServerConfig.client_keys) gets in.
        assert (await client_with(srv, tmp_path, extra)) == 2
        # A key file others can read is refused before anything is sent.
        key_file.chmod(0o644)
        with pytest.raises(ServeError, match="accessible by other users"):
            EnvClient(srv.address, key_file=key_file)._keys()
        key_file.chmod(0o600)
        # The documented variable works for a separate process.
        code = ("import asyncio; from tracewire.serve import EnvClient\n"
                "async def m():\n"
                f"    async with EnvClient({srv.address!r}) as c:\n"
                "        r = await c.run({'turns': 1, 'tokens': 3})\n"
                "        print(len(r.episode.traces[0].nodes))\n"
                "asyncio.run(m())")
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", code, stdout=asyncio.subprocess.PIPE,
            env={**os.environ, "TRACEWIRE_CLIENT_KEY_FILE": str(key_file)})
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0 and out.strip() == b"2"


async def test_default_key_file_is_private_and_removed_on_stop() -> None:
    async with server(LocalProcessPool(), workers=1) as srv:
        assert srv.client_key_file is not None
        path = srv.client_key_file
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    gone = not os.path.exists(path) and not os.path.exists(os.path.dirname(path))  # noqa: ASYNC240
    assert gone


async def test_ipc_and_inproc_endpoints_stay_without_curve() -> None:
    srv = EnvServer("standin", address=ADDRESS, config=ServerConfig(workers=1))
    async with srv:
        await srv.wait_ready()
        assert srv.worker_endpoint.startswith("ipc://")
        assert srv.health()["curve"] == {"clients": True, "workers": False}


async def test_forged_frames_on_the_direct_path_are_dropped() -> None:
    pool = RecordingPool()
    async with server(pool, workers=1) as srv, EnvClient(srv.address) as client:
        assert client._data_address is not None
        first = asyncio.Event()
        run = asyncio.create_task(client.run({"turns": 20, "tokens": 10, "delay": 0.02},
                                             request_id="known",
                                             on_delta=lambda d, e: first.set()))
        await asyncio.wait_for(first.wait(), 20)
        # Anyone on the host can reach the client's loopback data socket; say the request
        # id leaked too. Without the client's token nothing it sends is taken.
        ctx: zmq.Context[Any] = zmq.Context()
        push = ctx.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 0)
        push.connect(client._data_address)
        fake = encode_frames(Episode(env="standin"))
        for i in range(5):
            push.send_multipart([encode_envelope("reply", "known", {"i": 0, "seq": 1}),
                                 *fake])
            push.send_multipart([os.urandom(16), encode_envelope("reply", "known",
                                                                 {"i": 0, "seq": i}), *fake])
        await until(lambda: client.dropped >= 10, "the forged frames to be dropped")
        res = await asyncio.wait_for(run, 30)
        push.close()
        ctx.term()
        assert len(res.episode.traces[0].nodes) == 40
        assert_genuine([res.episode])


async def test_cli_server_with_a_tcp_worker_endpoint_holds_off_an_impostor() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tracewire", "serve", "standin", "--address", ADDRESS,
        "--worker-address", TCP, "--workers", "2", stdout=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        address = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode().split()[-1]
        key_file = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode().split()[3]
        async with EnvClient(address, key_file=key_file) as client:
            await until(lambda: _live(client, 2), "two workers", limit=60)
            stats = await client.stats()
            key = read_key_file(key_file)
            cfg = {"endpoint": stats["worker_endpoint"], "server_key": key.server_key,
                   "pids": [proc.pid, *(w["pid"] for w in stats["workers"])],
                   "ids": [w["id"] for w in stats["workers"]]}
            imp = await asyncio.create_subprocess_exec(
                sys.executable, str(IMPOSTOR), json.dumps(cfg), stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE)
            assert imp.stdin is not None
            await until(lambda: _refused_remote(client, 4), "refused handshakes", limit=60)
            results = await client.run_group({"turns": 2, "tokens": 10}, 6)
            imp.stdin.close()
            out, _ = await asyncio.wait_for(imp.communicate(), 60)
            report = json.loads(out)
            after = await client.stats()
        assert report["jobs"] == report["messages"] == 0
        assert_genuine([r.episode for r in results])
        assert after["bytes_forwarded"] == 0 and after["episodes_failed"] == 0
        assert len(report["seen"]) == 6 and all(not v.startswith("<")
                                                for v in report["seen"].values())
        # Nothing secret on any command line or in any environment it read.
        for v in report["seen"].values():
            assert key.secret not in v and all(w["id"] not in v for w in stats["workers"])
    finally:
        if proc.returncode is None:
            proc.terminate()
            await asyncio.wait_for(proc.wait(), 30)


async def _live(client: EnvClient, n: int) -> bool:
    return int((await client.health())["workers_live"]) >= n


async def _refused_remote(client: EnvClient, n: int) -> bool:
    stats = await client.stats()
    return int(stats["worker_handshakes_failed"]) + int(
        stats["handshakes_denied"].get("workers", 0)) >= n
