"""The recording invariant: a trace the proxy committed encodes, decodes to the same records,
and a stored episode holding it reads back."""

from __future__ import annotations

from pathlib import Path

from tracewire.codec import decode_record, record_bytes
from tracewire.store import Run, open_run
from tracewire.trace import Episode, Trace


def assert_codec_roundtrip(trace: Trace) -> None:
    """The binary codec gives back the same nodes and calls."""
    back = decode_record(record_bytes(trace))
    assert isinstance(back, Trace)
    assert back.nodes == trace.nodes
    assert back.calls == trace.calls
    assert back.columns.ids.tolist() == trace.columns.ids.tolist()


async def assert_store_roundtrip(traces: list[Trace], path: Path) -> None:
    """An episode holding ``traces`` is stored, and every trace reads back whole."""
    run = await Run.create(path)
    ep = Episode(traces=traces)
    await run.append(ep)
    await run.close()
    with open_run(path) as r:
        got = r.get(ep.id)
    assert len(got.traces) == len(traces)
    for g, t in zip(got.traces, traces, strict=True):
        assert g.nodes == t.nodes
        assert g.calls == t.calls
