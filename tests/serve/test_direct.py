"""The direct data path: workers on this host send episode data to the client, not the broker."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.codec.equality import assert_episode_equal
from tracewire.codec import decode_record, frames_to_record, record_bytes
from tracewire.serve._direct import is_local_endpoint, loopback_id, valid_data_address
from tracewire.serve._protocol import encode_envelope

from .conftest import client_of, serving, until
from .test_protocol import _raw


async def test_local_client_gets_episode_data_past_the_broker() -> None:
    task = {"turns": 30, "tokens": 500}
    async with serving() as srv:
        async with client_of(srv) as client:
            direct = await client.run(task)
        forwarded = srv.counters["bytes_forwarded"]
        async with client_of(srv, direct=False) as client:
            brokered = await client.run(task)
        size = len(record_bytes(brokered.episode))
        # Through the broker every token byte is forwarded; on the direct path none is.
        assert forwarded == 0
        assert srv.counters["bytes_forwarded"] >= size
        # DONE reaches the broker just after the reply reached the client: it then frees the
        # direct run's slot and counts it.
        await until(lambda: srv.counters["episodes_ok"] == 2 and srv.health()["inflight"] == 0,
                    "the broker to count both runs")
    # Both paths deliver the same episode (ids differ; compare the traces' content).
    a, b = direct.episode.traces[0], brokered.episode.traces[0]
    assert (a.columns.ids == b.columns.ids).all() and len(a.nodes) == len(b.nodes) == 60
    assert direct.wire_bytes < 1.05 * len(record_bytes(direct.episode))


async def test_direct_streaming_and_keep_frames_assemble_exactly() -> None:
    seen: list[int] = []
    async with serving() as srv, client_of(srv) as client:
        res = await client.run({"turns": 5, "tokens": 40, "delay": 0.03},
                               on_delta=lambda d, ep: seen.append(d.seq), keep_frames=True)
        group = await client.run_group({"turns": 3, "tokens": 10}, 3)
        assert srv.counters["bytes_forwarded"] == 0
    assert seen == list(range(len(seen))) and len(seen) >= 2
    assert res.frames is not None and res.deltas == len(seen)
    stored = decode_record(b"".join(frames_to_record(res.frames)))
    assert_episode_equal(stored, res.episode)
    assert [g.episode.group_index for g in group] == [0, 1, 2]
    assert len({g.episode.group_id for g in group}) == 1


async def test_broker_refuses_data_addresses_off_this_host() -> None:
    async with serving() as srv:
        for bad in ("tcp://10.0.0.1:5555", "tcp://example.invalid:1", "inproc://x", 42):
            env = await _raw(srv.address, [encode_envelope("run", "r1", {
                "task": {"turns": 1}, "data": bad})])
            assert env.kind == "error" and env.body["type"] == "ProtocolError"
            assert "data address" in env.body["message"]
        assert srv.counters["runs"] == 0


@pytest.mark.parametrize(("address", "local"), [
    ("tcp://127.0.0.1:5555", True), ("tcp://localhost:1", True), ("ipc:///tmp/x.sock", True),
    ("inproc://w", True), ("tcp://10.1.2.3:5555", False), ("tcp://0.0.0.0:5555", False),
])
def test_which_servers_count_as_local(address: str, local: bool) -> None:
    assert is_local_endpoint(address) is local
    assert valid_data_address(address) is (local and not address.startswith("inproc"))


async def test_no_direct_path_when_the_server_has_another_loopback(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A tunnelled 127.0.0.1 reaches another machine or network namespace: the server's hello
    # then names another loopback. Simulated by changing what this client reports as its
    # own (the only stand-in in this file: two network namespaces need privileges).
    import tracewire.serve._client as client_mod

    monkeypatch.setattr(client_mod, "loopback_id", lambda: "another-boot:1")
    async with serving() as srv, client_of(srv) as client:
        res = await client.run({"turns": 5, "tokens": 100})
        assert srv.counters["bytes_forwarded"] >= len(record_bytes(res.episode))
    assert len(res.episode.traces[0].nodes) == 10


@pytest.mark.skipif(not Path("/proc/self/ns/net").exists(), reason="needs Linux /proc")
def test_loopback_id_is_shared_by_processes_of_one_namespace() -> None:
    here = loopback_id()
    out = subprocess.run([sys.executable, "-c", "from tracewire.serve._direct import "
                          "loopback_id; print(loopback_id())"], capture_output=True, text=True,
                         check=True, timeout=60)
    assert here is not None and ":" in here and out.stdout.strip() == here


@pytest.mark.parametrize("direct", [True, False])
async def test_the_episode_a_client_assembles_re_encodes_to_the_workers_bytes(
        direct: bool) -> None:
    # compose stores a served episode by re-encoding what the client assembled from the
    # deltas (run.append(res.episode)): that must be the worker's own encoding, byte for byte.
    async with serving() as srv, client_of(srv, direct=direct) as client:
        res = await client.run({"turns": 6, "tokens": 300, "delay": 0.01},
                               on_delta=lambda d, ep: None, keep_frames=True)
        plain = await client.run({"turns": 4, "tokens": 50}, keep_frames=True)
    assert res.deltas >= 2 and plain.deltas == 0
    for r in (res, plain):
        assert r.frames is not None
        assert record_bytes(r.episode) == b"".join(frames_to_record(r.frames))
