"""The direct data path: workers on this host send episode data to the client, not the broker."""

from __future__ import annotations

import pytest

from tests.codec.equality import assert_episode_equal
from tracewire.codec import decode_record, frames_to_record, record_bytes
from tracewire.serve._direct import is_local_endpoint, valid_data_address
from tracewire.serve._protocol import encode_envelope

from .conftest import client_of, serving
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
        assert srv.counters["episodes_ok"] == 2
        assert srv.health()["inflight"] == 0  # DONE freed the direct run's slot
    # Both paths deliver the same episode (ids differ; compare the traces' content).
    a, b = direct.episode.traces[0], brokered.episode.traces[0]
    assert (a.tokens.ids == b.tokens.ids).all() and len(a.nodes) == len(b.nodes) == 60
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
