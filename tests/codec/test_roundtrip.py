"""Property tests: binary and JSON round trips are exact for random traces and episodes."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tracewire import Episode, Trace, codec

from .equality import assert_episode_equal, assert_trace_equal
from .strategies import episodes, traces


@settings(max_examples=150, deadline=None)
@given(traces())
def test_trace_frames_round_trip_is_exact(t: Trace) -> None:
    back = codec.decode_frames(codec.encode_frames(t))
    assert isinstance(back, Trace)
    assert_trace_equal(t, back)


@settings(max_examples=100, deadline=None)
@given(episodes())
def test_episode_record_round_trip_is_exact(e: Episode) -> None:
    rec = codec.record_bytes(e)
    assert codec.record_length(rec) == len(rec)
    back = codec.decode_record(rec)
    assert isinstance(back, Episode)
    assert_episode_equal(e, back)
    # Frames persisted as a record without decoding give the same bytes.
    assert b"".join(codec.frames_to_record(codec.encode_frames(e))) == rec


@settings(max_examples=100, deadline=None)
@given(episodes())
def test_json_round_trip_is_exact_and_stable(e: Episode) -> None:
    first = codec.encode_json(e)
    back = codec.decode_json(first)
    assert isinstance(back, Episode)
    assert codec.encode_json(back) == first
    for x, y in zip(e.traces, back.traces, strict=True):
        for name in x.columns.names():
            a, b = x.columns.column(name), y.columns.column(name)
            assert a.dtype == b.dtype
            if a.dtype.kind == "f":
                assert np.array_equal(a, b, equal_nan=True)
            else:
                assert np.array_equal(a, b)


@settings(max_examples=50, deadline=None)
@given(traces(), st.integers(0, 4))
def test_json_float_rounding_is_bounded(t: Trace, digits: int) -> None:
    back = codec.decode_json(codec.encode_json(t, float_digits=digits))
    assert isinstance(back, Trace)
    a, b = t.columns.logprobs, back.columns.logprobs
    assert np.array_equal(np.isnan(a), np.isnan(b))
    ok = ~np.isnan(a)
    # Rounding to `digits` decimals, then storing as float32.
    tol = 0.5 * 10.0**-digits + np.abs(a[ok]) * 1e-6
    assert np.all(np.abs(a[ok].astype(np.float64) - b[ok]) <= tol)


def test_decoded_columns_share_the_received_buffers() -> None:
    t = Trace()
    t.add_node(_msg(), ids=np.arange(1000), logprobs=np.zeros(1000))
    frames = codec.encode_frames(t)
    back = codec.decode_frames([bytes(f) for f in frames])
    assert isinstance(back, Trace)
    ids = back.columns.ids
    assert not ids.flags.owndata and not ids.flags.writeable  # a view over the frame
    # Appending to a decoded trace copies on growth and leaves the source untouched.
    back.add_node(_msg(), parent=0, ids=[7])
    assert back.columns.ids[-1] == 7 and len(back.columns) == 1001


def test_encode_shares_column_memory() -> None:
    t = Trace()
    t.add_node(_msg(), ids=np.arange(10))
    frames = codec.encode_frames(t)
    ids_frame = np.frombuffer(frames[1], dtype=np.int32)
    assert np.shares_memory(ids_frame, t.columns.ids)


def _msg():  # type: ignore[no-untyped-def]
    from tracewire import Message

    return Message(role="user", content="x")
