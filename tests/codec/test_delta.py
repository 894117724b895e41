"""Deltas: any mutation sequence streams to an equal trace; loss and reordering are caught."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracewire import DeltaError, Episode, Message, Span, Trace, codec

from .equality import assert_episode_equal, assert_trace_equal
from .strategies import apply_op, extra_sets, ops


def _wire(d: codec.EpisodeDelta) -> codec.EpisodeDelta:
    back = codec.decode_frames([bytes(f) for f in codec.encode_frames(d)])
    assert isinstance(back, codec.EpisodeDelta)
    return back


@settings(max_examples=120, deadline=None)
@given(
    extra_sets(),
    st.lists(st.tuples(st.integers(0, 2), st.lists(ops, max_size=4), st.booleans()), max_size=12),
)
def test_any_mutation_sequence_streams_to_an_equal_episode(
    extras: list[Any], steps: list[tuple[int, list[Any], bool]]
) -> None:
    e = Episode(env="env", task_key="k")
    for _ in range(2):
        t = e.new_trace()
        for name, dt, shape in extras:
            t.columns.add_column(name, dt, shape)
    sender, asm = codec.EpisodeSender(e), codec.EpisodeAssembler()
    for which, batch, send in steps:
        for op in batch:
            apply_op(e.traces[which % len(e.traces)], op, extras)
        if which == 2:
            e.ok = not e.ok
        if send:
            d = sender.delta()
            if d is not None:
                asm.apply(_wire(d))
                sender.commit(d)
    final = sender.delta(final=True)
    assert final is not None
    got = asm.apply(_wire(final))
    sender.commit(final)
    assert asm.final
    assert_episode_equal(e, got)
    for a, b in zip(e.traces, got.traces, strict=True):
        assert a.pending == b.pending  # previews stream too
    assert sender.delta() is None


def _episode() -> tuple[Episode, Trace]:
    e = Episode(env="x")
    t = e.new_trace()
    t.add_node(Message(role="user", content="q"), ids=[1, 2, 3])
    return e, t


def test_lost_and_reordered_deltas_are_detected_at_once() -> None:
    e, t = _episode()
    s, asm = codec.EpisodeSender(e), codec.EpisodeAssembler()
    d0 = s.delta()
    assert d0 is not None
    s.commit(d0)
    t.add_node(Message(role="assistant", content="a"), parent=0, sampled=True, ids=[4])
    d1 = s.delta()
    assert d1 is not None
    s.commit(d1)
    with pytest.raises(DeltaError, match="expected delta 0, got 1"):
        asm.apply(d1)
    asm.apply(d0)
    asm.apply(d1)
    with pytest.raises(DeltaError, match="expected delta 2, got 1"):
        asm.apply(d1)  # replayed


def test_base_cursor_mismatch_is_a_delta_error() -> None:
    e, t = _episode()
    s, asm = codec.EpisodeSender(e), codec.EpisodeAssembler()
    d0 = s.delta()
    assert d0 is not None
    asm.apply(d0)
    s.commit(d0)
    t.add_node(Message(role="assistant"), parent=0, ids=[5, 6])
    d1 = s.delta()
    assert d1 is not None
    bad = codec.EpisodeDelta(
        episode=d1.episode,
        seq=d1.seq,
        traces=[codec.TraceDelta(id=t.id, base=codec.Cursor(0, 0, 0, 0), nodes=d1.traces[0].nodes)],
    )
    before = codec.encode_json(asm.episode)  # type: ignore[arg-type]
    with pytest.raises(DeltaError, match="lost or reordered"):
        asm.apply(bad)
    assert codec.encode_json(asm.episode) == before  # rejected whole, nothing applied  # type: ignore[arg-type]


def test_cursor_advances_only_after_commit() -> None:
    e, t = _episode()
    s, asm = codec.EpisodeSender(e), codec.EpisodeAssembler()
    first = s.delta()
    assert first is not None
    # The send "failed": produce again; same content, same sequence number.
    t.add_node(Message(role="assistant"), parent=0, ids=[9])
    again = s.delta()
    assert again is not None and again.seq == first.seq
    assert len(again.traces[0].nodes) == 2
    with pytest.raises(DeltaError):
        s.commit(first)  # stale delta
    asm.apply(_wire(again))
    s.commit(again)
    assert_episode_equal(e, asm.episode)  # type: ignore[arg-type]


def test_delta_is_never_mutated_after_it_is_handed_out() -> None:
    e, t = _episode()
    t.timing["agent"] = Span(start=1.0)
    t.info["k"] = [1]
    s, asm = codec.EpisodeSender(e), codec.EpisodeAssembler()
    d = s.delta()
    assert d is not None
    seen = b"".join(bytes(f) for f in codec.encode_frames(d))
    got = asm.apply(d)
    s.commit(d)
    # Sender and receiver keep changing; the delta a callback received stays as it was.
    t.timing["agent"].end = 2.0
    t.info["k"].append(2)
    t.add_node(Message(role="assistant"), parent=0, ids=[7, 8])
    got.traces[0].info["k"] = "changed"
    got.traces[0].timing["x"] = Span(start=0.0)
    d2 = s.delta()
    assert d2 is not None
    asm.apply(d2)
    assert b"".join(bytes(f) for f in codec.encode_frames(d)) == seen
    assert np.array_equal(d.traces[0].columns["ids"], [1, 2, 3])


def test_discarded_trace_restarts_on_the_receiver() -> None:
    e, t = _episode()
    s, asm = codec.EpisodeSender(e), codec.EpisodeAssembler()
    d = s.delta()
    assert d is not None
    asm.apply(d)
    s.commit(d)
    # A retried attempt throws the trace away and starts over under the same id.
    fresh = Trace(t.id)
    fresh.add_node(Message(role="user", content="retry"), ids=[42])
    e.traces[0] = fresh
    s.discard_trace(t.id)
    d = s.delta()
    assert d is not None and d.traces[0].reset
    asm.apply(_wire(d))
    s.commit(d)
    assert_trace_equal(fresh, asm.episode.traces[0])  # type: ignore[union-attr]
    # Dropping a trace entirely.
    e.traces.clear()
    d = s.delta()
    assert d is not None and d.dropped == [t.id]
    asm.apply(_wire(d))
    s.commit(d)
    assert asm.episode is not None and asm.episode.traces == []


def test_delta_cost_does_not_grow_with_history() -> None:
    """Structural check (not timing): a delta after many turns holds only the new turn."""
    e = Episode()
    t = e.new_trace()
    s = codec.EpisodeSender(e)
    parent = None
    for k in range(2000):
        parent = t.add_node(Message(role="user"), parent=parent, ids=np.arange(10))
        if k == 1998:
            d = s.delta()
            assert d is not None
            s.commit(d)
    d = s.delta()
    assert d is not None
    assert len(d.traces[0].nodes) == 1 and d.traces[0].n_tokens == 10
    frames = codec.encode_frames(d)
    assert codec.encoded_size(frames) < 600
