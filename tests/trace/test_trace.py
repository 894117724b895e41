"""Trace model: columns, branches, notification."""

from __future__ import annotations

import pickle
from array import array

import numpy as np
import pytest

from tracewire import Columns, Message, Trace


def test_columns_grow_amortized_and_old_views_stay_valid() -> None:
    c = Columns()
    views = []
    for k in range(100):
        c.append(np.full(k, k), mask=1, logprobs=np.full(k, -0.5))
        views.append(c.ids)
    assert len(c) == sum(range(100))
    # A view taken before growth still shows what it showed.
    assert np.array_equal(views[10], np.repeat(np.arange(11), np.arange(11)))
    assert np.all(c.mask == 1) and np.all(c.logprobs == -0.5)


def test_python_values_are_stored_as_numpy_would_store_them() -> None:
    # Lists and int32 arrays take the memoryview path; numpy arrays the numpy one. Both
    # must leave the same bytes, through growth, adoption and a pickle round trip.
    rng = np.random.default_rng(7)
    ours, ref = Columns(), Columns()
    for k in range(300):
        n = int(rng.integers(0, 12))
        ids = [int(x) for x in rng.integers(-2**31, 2**31, n)]
        mask = int(rng.choice([0, 1, 7]))
        lps = None if k % 3 == 0 else [float(x) for x in rng.normal(size=n)]
        if k % 5 == 0 and lps:
            lps[0] = float("nan")
        given = array("i", ids) if k % 2 else ids
        assert ours.append(given, mask, lps) == ref.append(
            np.array(ids, np.int32), mask, None if lps is None else np.array(lps))
        if k == 150:
            ours = pickle.loads(pickle.dumps(ours))
            assert ours.ids.tobytes() == ref.ids.tobytes()
    for name in ("ids", "mask", "logprobs"):
        assert ours.column(name).tobytes() == ref.column(name).tobytes(), name
    assert ours.ids_bytes(5, 40) == ref.ids[5:40].tobytes()
    adopted = Columns.from_arrays({"ids": np.arange(3, dtype=np.int32)})
    adopted.ids.setflags(write=False)
    adopted.append([9, 10], 1, [-1.0, -2.0])  # read-only adopted arrays are reallocated
    assert adopted.ids.tolist() == [0, 1, 2, 9, 10]
    assert adopted.mask.tolist() == [0, 0, 0, 1, 1]


def test_bad_python_values_fail_as_numpy_would() -> None:
    c = Columns()
    with pytest.raises(OverflowError):
        c.append([2**31])
    with pytest.raises(TypeError):
        c.append(["7"])
    with pytest.raises(ValueError):
        c.append([1, 2], 1, [0.5])  # a logprob per id
    assert len(c) == 0  # nothing half-appended


def test_extra_columns_with_trailing_shape() -> None:
    c = Columns()
    c.append([1, 2])
    c.add_column("experts", np.uint8, (4, 2))
    c.append([3], extra={"experts": np.ones((1, 4, 2), np.uint8)})
    e = c.column("experts")
    assert e.shape == (3, 4, 2) and e[:2].sum() == 0 and e[2].sum() == 8
    c.append([4], extra={"adv": np.array([0.5], np.float32)})
    assert c.names() == ["ids", "mask", "logprobs", "experts", "adv"]
    assert c.column("adv").tolist() == [0.0, 0.0, 0.0, 0.5]
    with pytest.raises(ValueError):
        c.add_column("adv", np.float32)


def test_linear_branch_is_a_zero_copy_slice() -> None:
    t = Trace()
    n0 = t.add_node(Message(role="user"), ids=[1, 2, 3])
    n1 = t.add_node(Message(role="assistant"), parent=n0, sampled=True, ids=[4, 5],
                    logprobs=[-0.1, -0.2])
    b = t.branch(n1)
    assert b.contiguous
    assert np.shares_memory(b.ids, t.columns.ids)
    assert b.ids.tolist() == [1, 2, 3, 4, 5]
    assert b.mask.tolist() == [0, 0, 0, 1, 1]
    assert np.isnan(b.logprobs[:3]).all()


def test_branching_graph_paths_and_leaves() -> None:
    t = Trace()
    root = t.add_node(Message(role="user"), ids=[1])
    a = t.add_node(Message(role="assistant"), parent=root, sampled=True, ids=[2])
    b = t.add_node(Message(role="assistant"), parent=root, sampled=True, ids=[3])
    c = t.add_node(Message(role="user"), parent=a, ids=[4])
    assert t.leaves() == [b, c]
    assert t.path(c) == [root, a, c]
    br = t.branch(b)
    assert not br.contiguous
    assert br.ids.tolist() == [1, 3]
    assert [x.leaf for x in t.branches()] == [b, c]
    with pytest.raises(IndexError):
        t.add_node(Message(role="user"), parent=99)


def test_watchers_are_notified_and_failures_do_not_propagate(
    caplog: pytest.LogCaptureFixture,
) -> None:
    t = Trace()
    seen: list[int] = []

    def bad(_: Trace) -> None:
        raise RuntimeError("watcher bug")

    t.watch(bad)
    unwatch = t.watch(lambda tr: seen.append(len(tr.nodes)))
    t.add_node(Message(role="user"))
    t.notify()
    t.set_pending([Message(role="tool", content="result")])
    unwatch()
    t.notify()
    assert seen == [1, 1]
    assert "watcher bug" in caplog.text
    assert t.pending[0].content == "result"


def test_errors_and_rewards() -> None:
    t = Trace()
    t.set_reward("acc", 1.0, weight=2.0)
    t.set_reward("fmt", 0.5)
    assert t.reward == 2.5
    assert t.ok
    t.add_error("ValueError", "bad", phase="scoring")
    assert not t.ok and t.errors[0].phase == "scoring"


def test_tokens_is_a_deprecated_alias_of_columns() -> None:
    t = Trace()
    t.add_node(Message(role="assistant", content="x"), sampled=True, ids=[5, 6])
    with pytest.warns(DeprecationWarning, match=r"Trace\.columns"):
        cols = t.tokens
    assert cols is t.columns and cols.ids.tolist() == [5, 6]
    other = Columns()
    with pytest.warns(DeprecationWarning, match=r"Trace\.columns"):
        t.tokens = other
    assert t.columns is other
    given = Columns()
    with pytest.warns(DeprecationWarning, match=r"Trace\.columns"):
        old = Trace(tokens=given)
    assert old.columns is given
