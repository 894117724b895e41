"""Trace model: columns, branches, notification."""

from __future__ import annotations

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
