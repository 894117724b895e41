"""The stand-in runner and the capacity hint it relies on."""

from __future__ import annotations

import numpy as np

from tracewire.serve import standin_runner
from tracewire.trace import Columns, Episode, Trace


def test_reserve_keeps_contents_and_appends_within_it_do_not_reallocate() -> None:
    c = Columns()
    c.append(np.arange(5), 1, np.zeros(5, np.float32))
    c.reserve(100)
    before = c.ids
    buf = c._arrays["ids"]
    for _ in range(19):
        c.append(np.arange(5))
    assert len(c) == 100 and c._arrays["ids"] is buf  # no reallocation
    assert list(before) == [0, 1, 2, 3, 4] and list(c.mask[:6]) == [1] * 5 + [0]
    c.reserve(10)  # smaller than held: nothing changes
    assert len(c) == 100 and c._arrays["ids"] is buf
    c.append(np.arange(3))  # beyond the reservation: grows as usual
    assert len(c) == 103 and list(c.ids[-3:]) == [0, 1, 2]


async def test_standin_turns_are_node_pairs_calls_and_notifies() -> None:
    notified: list[int] = []

    class Watched(Episode):
        __slots__ = ()

        def new_trace(self, **kw: object) -> Trace:
            t = super().new_trace(**kw)
            t.watch(lambda tr: notified.append(len(tr.nodes)))
            return t

    ep = Watched()
    run = standin_runner()
    await run({"turns": 300, "tokens": 7}, ep)
    t = ep.traces[0]
    assert len(t.nodes) == 600 and len(t.calls) == 300 and len(t.columns) == 300 * 15
    assert notified[:300] == [2 * (i + 1) for i in range(300)] and len(notified) == 301
    assert t.nodes[3].parent == 2 and t.nodes[3].sampled and t.calls[1].node == 3
    assert (t.nodes[2].start, t.nodes[2].end, t.nodes[3].end) == (15, 23, 30)
    assert int(t.columns.mask.sum()) == 300 * 7 and t.completed and t.reward == 1.0
