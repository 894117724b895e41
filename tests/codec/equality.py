"""Exact equality of traces and episodes: structs equal, arrays bit-equal."""

from __future__ import annotations

import numpy as np

from tracewire import Episode, Trace

FIELDS = ("id", "schema", "agent", "nodes", "calls", "errors", "timing", "rewards", "metrics",
          "info", "stop", "completed", "ok")


def assert_trace_equal(a: Trace, b: Trace, *, pending: bool = False) -> None:
    for f in FIELDS:
        assert getattr(a, f) == getattr(b, f), f
    if pending:
        assert a.pending == b.pending
    assert a.columns.names() == b.columns.names()
    for name in a.columns.names():
        x, y = a.columns.column(name), b.columns.column(name)
        assert x.dtype == y.dtype and x.shape == y.shape, name
        # Bit equality: NaN payloads and signed zeros must survive too.
        assert np.ascontiguousarray(x).tobytes() == np.ascontiguousarray(y).tobytes(), name


def assert_episode_equal(a: Episode, b: Episode) -> None:
    for f in ("id", "env", "task_key", "task", "group_id", "group_index", "run", "ok",
              "errors", "timing", "info"):
        assert getattr(a, f) == getattr(b, f), f
    assert [t.id for t in a.traces] == [t.id for t in b.traces]
    for x, y in zip(a.traces, b.traces, strict=True):
        assert_trace_equal(x, y)
