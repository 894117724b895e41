"""The mismatch report's aligner: its stretches are a valid decomposition of both sequences
(what lies between them is equal), equal sequences have none, isolated edits come out
exactly, and hostile inputs (random, periodic, a near-constant alphabet) stay bounded."""

from __future__ import annotations

import difflib

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tracewire.tito._mismatch import MAX_WINDOW, align


def _check_decomposition(r: np.ndarray, c: np.ndarray,
                         out: list[tuple[int, int, int, int]]) -> None:
    i = j = 0
    for r0, r1, c0, c1 in out:
        assert r0 >= i and c0 >= j and r1 >= r0 and c1 >= c0
        assert r0 - i == c0 - j  # the gap before a stretch is the same length on both sides
        assert np.array_equal(r[i:r0], c[j:c0])  # ... and equal
        assert (r1 - r0) + (c1 - c0) > 0
        i, j = r1, c1
    assert np.array_equal(r[i:], c[j:])


EDIT = st.tuples(st.sampled_from(["sub", "ins", "del"]), st.floats(0, 1),
                 st.integers(1, 12))


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2000), st.integers(2, 600), st.lists(EDIT, max_size=12),
       st.integers(0, 2**32 - 1))
def test_stretches_decompose_both_sequences(n: int, alphabet: int,
                                            edits: list[tuple[str, float, int]],
                                            seed: int) -> None:
    rng = np.random.default_rng(seed)
    r = rng.integers(0, alphabet, n)
    c = r.copy()
    for op, where, k in edits:
        at = int(where * len(c))
        if op == "sub":
            c[at:at + k] = rng.integers(0, alphabet, len(c[at:at + k]))
        elif op == "ins":
            c = np.concatenate([c[:at], rng.integers(0, alphabet, k), c[at:]])
        else:
            c = np.concatenate([c[:at], c[at + k:]])
    out = align(r, c)
    _check_decomposition(r, c, out)
    if np.array_equal(r, c):
        assert out == []


def test_isolated_edits_are_found_exactly() -> None:
    rng = np.random.default_rng(1)
    r = rng.integers(1000, 50_000, 30_000)
    c = r.copy()
    c[5_000] = 7  # a substitution
    c = np.concatenate([c[:12_000], [8, 9], c[12_000:]])  # an insertion
    c = np.concatenate([c[:20_002], c[20_005:]])  # a deletion of three
    assert align(r, c) == [(5_000, 5_001, 5_000, 5_001), (12_000, 12_000, 12_000, 12_002),
                           (20_000, 20_003, 20_002, 20_002)]


def test_repetitive_text_stays_in_step() -> None:
    # Turn t of a loop looks like turn t+1 a few ids on; one turn retokenized (each id split
    # in two) must not shift the rest of the alignment by a turn.
    turns = [np.array([100, 101, 102, 200 + t, 103, 104, 105, 106, 107, 108, 1])
             for t in range(40)]
    r = np.concatenate(turns)
    split = [*turns[:5], np.array([9000, 9001, 9002, 9003, 9004, 9005, 1]), *turns[6:]]
    c = np.concatenate(split)
    out = align(r, c)
    _check_decomposition(r, c, out)
    assert len(out) == 1
    r0, r1, c0, c1 = out[0]
    assert r0 >= 55 and r1 <= 66 and c0 >= 55 and c1 <= 62


def test_hostile_inputs_stay_bounded() -> None:
    rng = np.random.default_rng(2)
    n = 200_000
    # Nothing shared: one stretch, found without searching past MAX_WINDOW.
    out = align(rng.integers(0, 600, n), rng.integers(600, 1200, n))
    assert out == [(0, n, 0, n)]
    # A two-letter alphabet: every window has matches; still a valid decomposition.
    r = rng.integers(0, 2, 20_000)
    c = r.copy()
    c[rng.integers(0, len(c), 400)] = 2
    _check_decomposition(r, c, align(r, c))
    assert n > MAX_WINDOW


def test_agrees_with_an_exact_diff_on_sparse_edits() -> None:
    # Where edits are apart, the stretches are difflib's (what the report used before).
    rng = np.random.default_rng(3)
    r = rng.integers(0, 5000, 4000)
    c = r.copy()
    for at in range(100, 3900, 250):
        c[at:at + 3] = rng.integers(5000, 6000, 3)
    ref = [(a0, a1, b0, b1) for op, a0, a1, b0, b1 in difflib.SequenceMatcher(
        a=r.tolist(), b=c.tolist(), autojunk=False).get_opcodes() if op != "equal"]
    assert align(r, c) == ref
