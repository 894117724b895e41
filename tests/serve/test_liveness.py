"""ClientWatch: who promised heartbeats, who is overdue; a promise is untrusted input."""

from __future__ import annotations

from tracewire.serve._liveness import MAX_INTERVAL, ClientWatch


def test_silent_client_is_lost_after_its_grace_and_a_beat_keeps_it() -> None:
    w = ClientWatch(floor=2.0)
    w.promise(b"a", 0.5, now=0.0)  # grace max(2.0, 4 x 0.5) = 2.0
    w.promise(b"b", 1.0, now=0.0)  # grace 4.0
    assert w.lost(1.9) == set()
    w.saw(b"a", 1.9)
    assert w.lost(3.0) == set()
    assert w.lost(4.5) == {b"a", b"b"}
    w.saw(b"never-promised", 4.5)  # not judged
    assert b"never-promised" not in w.lost(100.0)


def test_promises_are_bounded_and_non_numbers_ignored() -> None:
    w = ClientWatch(floor=2.0)
    w.promise(b"huge", 1e12, now=0.0)
    w.promise(b"text", "0.5", now=0.0)
    w.promise(b"flag", True, now=0.0)
    assert len(w) == 1
    assert w.lost(4 * MAX_INTERVAL - 1) == set() and w.lost(4 * MAX_INTERVAL + 1) == {b"huge"}
    w.keep_only(set())
    assert len(w) == 0
