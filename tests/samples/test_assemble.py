"""Golden tests of compute → truncate → merge over hand-built traces."""

from __future__ import annotations

import numpy as np
import pytest

from tracewire import HookError, Message, Trace
from tracewire.samples import (
    Sample,
    SampleBuilder,
    assemble,
    default_picker,
    default_postprocess,
    hook_name,
)

from .builders import complete, fail, golden, prompt

F = np.float32


def lp(*xs: float) -> list[float]:
    return [float(F(x)) for x in xs]


def one(samples: list[Sample]) -> Sample:
    assert len(samples) == 1
    return samples[0]


def test_golden_example() -> None:
    s = one(assemble(golden()))
    assert s.tokens.tolist() == [1, 2, 3, 10, 11, 20, 21, 30, 31]
    assert s.tokens.dtype == np.int32 and s.loss_mask.dtype == np.uint8
    assert s.logprobs is not None and s.logprobs.dtype == np.float32
    assert s.prompt_len == 3 and s.response_len == 6
    assert s.response_mask.tolist() == [1, 1, 0, 0, 1, 1]
    assert s.response_logprobs is not None
    assert s.response_logprobs.tolist() == [-0.125, -0.25, 0, 0, -0.5, -1.0]
    # Whole-sequence arrays: the prompt region is mask 0, logprob 0.
    assert s.loss_mask.tolist() == [0, 0, 0, 1, 1, 0, 0, 1, 1]
    assert s.logprobs.tolist() == [0, 0, 0, -0.125, -0.25, 0, 0, -0.5, -1.0]
    assert s.status == "completed" and s.finish_reason == "stop"
    assert s.spans == [(2, 3, 5), (4, 7, 9)]
    assert s.empty_reason is None


def test_golden_truncated_at_8() -> None:
    s = one(assemble(golden(), max_seq_len=8))
    assert s.status == "truncated"
    assert s.tokens.tolist() == [1, 2, 3, 10, 11, 20, 21, 30]
    assert s.response_mask.tolist() == [1, 1, 0, 0, 1]
    assert s.response_logprobs is not None
    assert s.response_logprobs.tolist() == [-0.125, -0.25, 0, 0, -0.5]
    assert s.spans == [(2, 3, 5), (4, 7, 8)]


@pytest.mark.parametrize(
    ("limit", "tokens", "status"),
    [
        (100, [1, 2, 3, 10, 11, 20, 21, 30, 31], "completed"),
        (9, [1, 2, 3, 10, 11, 20, 21, 30, 31], "completed"),  # exactly at the end
        (7, [1, 2, 3, 10, 11], "truncated"),  # turn 2's completion would be empty: dropped
        (6, [1, 2, 3, 10, 11], "truncated"),  # overshoot into the tool result: dropped
        (5, [1, 2, 3, 10, 11], "truncated"),  # at the turn boundary
        (4, [1, 2, 3, 10], "truncated"),  # inside turn 1
    ],
)
def test_truncation_inside_at_before_turns(limit: int, tokens: list[int], status: str) -> None:
    s = one(assemble(golden(), max_seq_len=limit))
    assert s.tokens.tolist() == tokens
    assert s.status == status
    assert s.loss_mask.tolist() == [0, 0, 0, 1, 1, 0, 0, 1, 1][: len(tokens)]


@pytest.mark.parametrize("limit", [1, 2, 3])
def test_everything_truncated_away(limit: int) -> None:
    s = one(assemble(golden(), max_seq_len=limit))
    assert s.empty_reason == "all_truncated"
    assert s.status == "aborted" and s.tokens.size == 0 and s.loss_mask.size == 0


def test_bad_max_seq_len() -> None:
    with pytest.raises(ValueError):
        assemble(golden(), max_seq_len=0)


def test_no_turns_is_no_records() -> None:
    t = Trace()
    s = one(assemble(t))
    assert (s.empty_reason, s.status, s.tokens.size) == ("no_records", "aborted", 0)
    # Prompt nodes and failed calls alone are still no model turns.
    p = prompt(t, None, [("user", "hi")], [5, 6])
    fail(t, p)
    assert one(assemble(t)).empty_reason == "no_records"


def test_four_turns() -> None:
    t = Trace()
    p = prompt(t, None, [("system", "s"), ("user", "u")], [1, 2])
    c = complete(t, p, [3, 4, 5], [-1, -2, -3], "tool_calls", tool=True)
    p = prompt(t, c, [("tool", "a")], [6])
    c = complete(t, p, [7], [-4], "tool_calls", tool=True)
    p = prompt(t, c, [("tool", "b"), ("user", "more")], [8, 9, 10])
    c = complete(t, p, [11, 12], [-5, -6], "stop")
    p = prompt(t, c, [("user", "again")], [13])
    complete(t, p, [14], [-0.5], "stop")
    s = one(assemble(t))
    assert s.tokens.tolist() == list(range(1, 15))
    assert s.prompt_len == 2
    assert s.response_mask.tolist() == [1, 1, 1, 0, 1, 0, 0, 0, 1, 1, 0, 1]
    assert s.response_logprobs is not None
    assert s.response_logprobs.tolist() == [-1, -2, -3, 0, -4, 0, 0, 0, -5, -6, 0, -0.5]
    assert s.status == "completed"
    assert [x[1:] for x in s.spans] == [(2, 5), (6, 7), (10, 12), (13, 14)]
    assert s.metadata["turns"] == 4
    # Truncating inside turn 3 keeps turns 1-2 and part of 3.
    s = one(assemble(t, max_seq_len=11))
    assert s.tokens.tolist() == list(range(1, 12))
    assert (s.status, len(s.spans)) == ("truncated", 3)


@pytest.mark.parametrize(
    ("finish", "status"),
    [
        ("tool_calls", "completed"),
        ("stop", "completed"),
        ("length", "truncated"),
        ("abort", "aborted"),
        (None, "aborted"),
        ("content_filter", "aborted"),
    ],
)
def test_finish_reasons_and_merge_stop(finish: str | None, status: str) -> None:
    t = Trace()
    p1 = prompt(t, None, [("user", "u")], [1, 2])
    c1 = complete(t, p1, [3, 4], [-1, -1], finish)
    p2 = prompt(t, c1, [("user", "go on")], [5])
    complete(t, p2, [6], [-2], "stop")
    s = one(assemble(t))
    assert s.status == status
    if status == "completed":
        assert s.tokens.tolist() == [1, 2, 3, 4, 5, 6]
    else:
        # Merging stops at the first turn that did not complete normally.
        assert s.tokens.tolist() == [1, 2, 3, 4]
        assert s.finish_reason == finish


def test_length_on_last_turn() -> None:
    t = Trace()
    p = prompt(t, None, [("user", "u")], [1])
    complete(t, p, [2, 3], [-1, -1], "length")
    s = one(assemble(t))
    assert (s.status, s.tokens.tolist(), s.finish_reason) == ("truncated", [1, 2, 3], "length")


def test_trailing_failed_call_marks_aborted() -> None:
    t = golden()
    last = len(t.nodes) - 1
    p3 = prompt(t, last, [("user", "next")], [40])
    fail(t, p3)
    s = one(assemble(t))
    assert s.status == "aborted"
    assert s.tokens.tolist() == [1, 2, 3, 10, 11, 20, 21, 30, 31]  # trailing prompt dropped
    # A failed call that was retried successfully changes nothing.
    complete(t, p3, [41], [-1], "stop")
    s = one(assemble(t))
    assert s.status == "completed" and s.tokens.tolist()[-2:] == [40, 41]


def test_missing_logprobs_are_null() -> None:
    t = Trace()
    p = prompt(t, None, [("user", "u")], [1])
    complete(t, p, [2, 3], None, "stop")
    s = one(assemble(t))
    assert s.logprobs is None and s.nulls == ["logprobs"]
    assert s.response_logprobs is None
    assert s.tokens.tolist() == [1, 2, 3] and s.loss_mask.tolist() == [0, 1, 1]


def test_truncation_keeps_logprobs_when_missing_part_is_cut() -> None:
    t = Trace()
    p = prompt(t, None, [("user", "u")], [1])
    complete(t, p, [2, 3], [-1.0, float("nan")], "stop")
    assert one(assemble(t)).logprobs is None
    s = one(assemble(t, max_seq_len=2))
    assert s.logprobs is not None and s.logprobs.tolist() == [0, -1.0]


def test_turn_without_token_ids() -> None:
    t = Trace()
    p = prompt(t, None, [("user", "u")], [1])
    c = complete(t, p, [], None, "stop", has_tokens=False)
    assert one(assemble(t)).empty_reason == "no_tokens"
    # Turns before a token-less one still make a sample, marked aborted.
    t = golden()
    p = prompt(t, len(t.nodes) - 1, [("user", "u")], [50])
    c = complete(t, p, [], None, "stop", has_tokens=False)
    del c
    s = one(assemble(t))
    assert s.status == "aborted" and s.tokens.tolist() == [1, 2, 3, 10, 11, 20, 21, 30, 31]


def test_retry_is_dropped_by_default_picker() -> None:
    t = Trace()
    p1 = prompt(t, None, [("user", "u")], [1, 2])
    c1 = complete(t, p1, [3], [-1], "tool_calls", tool=True)
    p2 = prompt(t, c1, [("tool", "r")], [4])
    first = complete(t, p2, [5, 6], [-1, -1], "stop")  # the harness retried this one
    second = complete(t, p2, [7], [-3], "stop")
    samples = assemble(t)
    s = one(samples)
    assert s.leaf == second and s.tokens.tolist() == [1, 2, 3, 4, 7]
    # Without a picker both attempts are samples, in leaf order; the shared turn 1 is
    # trainable only in the earliest one.
    both = assemble(t, picker=None)
    assert [x.leaf for x in both] == [first, second]
    assert both[0].loss_mask.tolist() == [0, 0, 1, 0, 1, 1]
    assert both[1].loss_mask.tolist() == [0, 0, 0, 0, 1]
    # Without the postprocessor both keep turn 1 trainable.
    raw = assemble(t, picker=None, postprocess=None)
    assert raw[1].loss_mask.tolist() == [0, 0, 1, 0, 1]
    assert default_picker(t, [first, second]) == [second]


def test_tree_shared_spans() -> None:
    t = Trace()
    p1 = prompt(t, None, [("user", "u")], [1])
    c1 = complete(t, p1, [2, 3], [-1, -1], "tool_calls", tool=True)
    # Two different continuations of the same turn (e.g. two tool results): siblings of
    # prompt-side nodes, but each leaf is the latest child of its own parent.
    pa = prompt(t, c1, [("tool", "a")], [4])
    ca = complete(t, pa, [5], [-2], "stop")
    pb = prompt(t, c1, [("tool", "b")], [6, 7])
    cb = complete(t, pb, [8, 9], [-3, -4], "stop")
    a, b = assemble(t)
    assert (a.leaf, b.leaf) == (ca, cb)
    assert a.tokens.tolist() == [1, 2, 3, 4, 5] and a.loss_mask.tolist() == [0, 1, 1, 0, 1]
    assert b.tokens.tolist() == [1, 2, 3, 6, 7, 8, 9]
    assert b.loss_mask.tolist() == [0, 0, 0, 0, 0, 1, 1]
    assert b.logprobs is not None and b.logprobs.tolist() == [0, -1, -1, 0, 0, -3, -4]
    # Truncation applies per branch before the shared turn is handed out.
    a2, b2 = assemble(t, max_seq_len=7)
    assert a2.loss_mask.tolist() == [0, 1, 1, 0, 1]
    assert b2.loss_mask.tolist() == [0, 0, 0, 0, 0, 1, 1]
    a3, b3 = assemble(t, max_seq_len=2)
    assert (a3.status, b3.status) == ("truncated", "truncated")
    assert [a3.tokens.tolist(), b3.tokens.tolist()] == [[1, 2], [1, 2]]
    assert [a3.loss_mask.tolist(), b3.loss_mask.tolist()] == [[0, 1], [0, 0]]


def test_shared_turn_cut_in_first_sample_is_trained_in_second() -> None:
    samples = [
        Sample(
            np.array([1, 2, 3], np.int32),
            np.array([0, 1, 1], np.uint8),
            None,
            leaf=5,
            spans=[(1, 1, 3)],
        ),
        Sample(
            np.array([1, 2, 3, 4], np.int32),
            np.array([0, 1, 1, 1], np.uint8),
            None,
            leaf=6,
            spans=[(1, 1, 3), (2, 3, 4)],
        ),
    ]
    samples[0].tokens = samples[0].tokens[:2]
    samples[0].loss_mask = samples[0].loss_mask[:2]
    samples[0].spans = [(1, 1, 2)]
    out = default_postprocess(Trace(), samples)
    assert out[1].loss_mask.tolist() == [0, 0, 1, 1]


def test_token_mismatch_new_root_is_its_own_sample() -> None:
    t = Trace()
    p1 = prompt(t, None, [("user", "u")], [1, 2])
    c1 = complete(t, p1, [3, 4], [-1, -1], "stop")
    # The upstream re-tokenized turn 1's answer differently: the proxy starts a new root.
    p2 = prompt(t, None, [("user", "u"), ("assistant", "a"), ("user", "v")], [1, 2, 3, 99, 5])
    c2 = complete(t, p2, [6], [-2], "stop")
    a, b = assemble(t)
    assert (a.leaf, b.leaf) == (c1, c2)
    assert a.tokens.tolist() == [1, 2, 3, 4] and a.loss_mask.tolist() == [0, 0, 1, 1]
    assert b.tokens.tolist() == [1, 2, 3, 99, 5, 6] and b.prompt_len == 5
    assert b.loss_mask.tolist() == [0, 0, 0, 0, 0, 1]


def test_metadata_precedence() -> None:
    t = golden()
    s = one(
        assemble(
            t,
            metadata={"task": "a", "leaf": "request", "x": 1, "turns": "request"},
            computed={"session_id": "s1", "x": 2},
            overrides={"x": 3, "turns": "collect", "y": 4},
            group_id="g",
            group_index=2,
        )
    )
    assert s.metadata == {
        "task": "a",
        "leaf": s.leaf,
        "x": 3,
        "turns": "collect",
        "y": 4,
        "session_id": "s1",
        "trace_id": t.id,
        "status": "completed",
        "finish_reason": "stop",
    }
    assert (s.group_id, s.group_index, s.trace_id) == ("g", 2, t.id)


def test_hooks_errors_name_the_hook() -> None:
    t = golden()

    def my_picker(trace: Trace, leaves: list[int]) -> list[int]:
        raise RuntimeError("boom")

    def my_post(trace: Trace, samples: list[Sample]) -> list[Sample]:
        raise KeyError("bad")

    with pytest.raises(HookError, match="my_picker"):
        assemble(t, picker=my_picker)
    with pytest.raises(HookError, match="my_post"):
        assemble(t, postprocess=my_post)
    with pytest.raises(HookError, match="not among leaves"):
        assemble(t, picker=lambda tr, leaves: [0])
    with pytest.raises(HookError, match="non-Samples"):
        assemble(t, postprocess=lambda tr, ss: [1])  # type: ignore[list-item]
    assert one(assemble(t, picker=lambda tr, leaves: [])).empty_reason == "none_picked"


def test_hook_name_is_short_for_records_and_qualified_for_errors() -> None:
    # The proxy records request/response hooks in Call.hooks by their short name; hook
    # errors name the qualified one. One function serves both (samples.hook_name).
    def inner(trace: Trace, leaves: list[int]) -> list[int]:
        return leaves

    class Picky:
        def __call__(self, trace: Trace, leaves: list[int]) -> list[int]:
            return leaves

        def __repr__(self) -> str:
            return "Picky()"

    assert hook_name(inner) == "inner"
    assert hook_name(inner, qualified=True).endswith("<locals>.inner")
    assert hook_name(Picky()) == hook_name(Picky(), qualified=True) == "Picky()"
    with pytest.raises(HookError, match=r"<locals>\.bad_pick raised"):
        def bad_pick(trace: Trace, leaves: list[int]) -> list[int]:
            raise ValueError("no")

        assemble(golden(), picker=bad_pick)


def test_hooks_cannot_write_into_the_trace() -> None:
    t = golden()
    before = t.columns.mask.copy()

    def scribble(trace: Trace, samples: list[Sample]) -> list[Sample]:
        samples[0].loss_mask[:] = 7
        return samples

    with pytest.raises(HookError, match="scribble"):
        assemble(t, postprocess=scribble)
    assert np.array_equal(t.columns.mask, before)


def test_builder_streams_and_matches_one_shot() -> None:
    t = Trace()
    b = SampleBuilder(t).attach()
    p = prompt(t, None, [("system", "s"), ("user", "u")], [1, 2, 3])
    c = complete(t, p, [10, 11], [-0.125, -0.25], "tool_calls", tool=True)
    assert b.summary()["turns"] == 1
    for k in range(5):
        p = prompt(t, c, [("tool", f"r{k}")], [20 + k, 21 + k])
        c = complete(t, p, [30 + k], [-0.5], "tool_calls", tool=True)
        for limit in (None, 4, 9, 12):
            got = b.samples(max_seq_len=limit)
            want = assemble(t, max_seq_len=limit)
            assert len(got) == len(want)
            assert all(x.equals(y) for x, y in zip(got, want, strict=True))
    # A retry fork mid-way: the builder and a fresh assembly agree on both branches.
    complete(t, p, [99], [-1], "stop")
    got, want = b.samples(picker=None), assemble(t, picker=None)
    assert len(got) == 2 and all(x.equals(y) for x, y in zip(got, want, strict=True))
    s = b.summary()
    assert (s["turns"], s["branches"], s["tokens"]) == (7, 2, len(t.columns))
    b.close()
    b.close()  # idempotent
    complete(t, p, [98], [-1], "stop")
    # A closed builder no longer follows commits but still catches up when asked.
    assert b.summary()["turns"] == 8


def test_call_committed_after_its_children() -> None:
    # Unusual order (call appended after later nodes): the builder still links the turns.
    t = Trace()
    b = SampleBuilder(t).attach()
    p1 = prompt(t, None, [("user", "u")], [1])
    c1 = t.add_node(
        Message(role="assistant", content="x"), parent=p1, sampled=True, ids=[2], logprobs=[-1.0]
    )
    p2 = prompt(t, c1, [("user", "v")], [3])
    t.notify()
    from tracewire import Call

    t.add_call(Call(finish_reason="stop", node=c1, prompt_node=p1))
    complete(t, p2, [4], [-2.0], "stop")
    s = one(b.samples())
    assert s.tokens.tolist() == [1, 2, 3, 4] and len(s.spans) == 2
    assert s.equals(one(assemble(t)))


def test_interleaved_branches_gather_across_column_runs() -> None:
    # Two conversations committed alternately: each branch spans several column runs.
    t = Trace()
    pa = prompt(t, None, [("user", "a")], [1])
    pb = prompt(t, None, [("user", "b")], [100])
    ca = complete(t, pa, [2], [-1], "tool_calls")
    cb = complete(t, pb, [101], [-1], "tool_calls")
    pa = prompt(t, ca, [("tool", "a")], [3])
    pb = prompt(t, cb, [("tool", "b")], [102])
    complete(t, pa, [4], [-2], "stop")
    complete(t, pb, [103], [-2], "stop")
    a, b = assemble(t)
    assert a.tokens.tolist() == [1, 2, 3, 4] and b.tokens.tolist() == [100, 101, 102, 103]
    assert a.loss_mask.tolist() == [0, 1, 0, 1]
    assert a.logprobs is not None and a.logprobs.tolist() == [0, -1, 0, -2]
    a, b = assemble(t, max_seq_len=3)
    assert a.tokens.tolist() == [1, 2] and b.tokens.tolist() == [100, 101]


def test_builder_attached_late_to_a_long_trace() -> None:
    # More nodes than the loop-side watcher takes on at once: the collect catches up.
    t = Trace()
    c = complete(t, prompt(t, None, [("user", "u")], [1]), [2], [-1.0], "tool_calls")
    for k in range(700):
        c = complete(t, prompt(t, c, [("tool", str(k))], [3]), [4], [-1.0], "tool_calls")
    b = SampleBuilder(t).attach(catch_up=False)
    complete(t, prompt(t, c, [("user", "end")], [5]), [6], [-1.0], "stop")
    (s,) = b.samples()
    assert s.tokens.shape == (2 * 702,) and len(s.spans) == 702
    assert s.equals(assemble(t)[0])
