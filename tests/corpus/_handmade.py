"""Corpus case of one episode built by hand with the public trace API, reaching what the
recorded runs do not: two traces (a sub-agent linked from the main one), a second branch,
extra columns of other dtypes and trailing shapes, content parts, reasoning, a node without
tokens, errors, weighted rewards, pending messages. Its bytes through every encoding: the
store's record and journal, ``encode_frames`` of the episode and of each ``EpisodeSender``
delta, ``encode_json``, and its samples."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from ._runs import Corpus, det, run_files

__all__ = ["handmade_records"]


def _turns(trace: Any, sub: Any) -> Iterator[str]:
    """Append the episode's turns, yielding a label after each step (the caller notifies)."""
    from tracewire.trace import Call, Link, Message, Span, ToolCall

    def extra(n: int, k: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(k)
        return {"top_ids": rng.integers(0, 1000, (n, 4), dtype=np.int32),
                "entropy": rng.random(n).astype(np.float16)}

    root = trace.add_node(Message(role="system", content="Be exact."), ids=[1, 2, 3],
                          extra=extra(3, 0), digest="d-system")
    user = trace.add_node(Message(role="user", content=[
        {"type": "text", "text": "What is 6 * 7?"}, {"type": "image_url", "image_url": {
            "url": "data:image/png;base64,AAAA"}}]), parent=root, ids=[4, 5, 6, 7],
        extra=extra(4, 1))
    trace.set_pending([Message(role="user", content="(in flight)")])
    yield "prompt"
    answer = trace.add_node(
        Message(role="assistant", content=None, reasoning="6 * 7 is 42; check with a tool.",
                tool_calls=[ToolCall(id="call-1", name="calculator",
                                     arguments='{"expression": "6 * 7"}')]),
        parent=user, sampled=True, ids=[8, 9, 10], extra=extra(3, 2),
        logprobs=np.array([-0.5, -0.0, -1e-30], np.float32))
    trace.add_call(Call(model="m", endpoint="chat", sampling={"temperature": 0.7, "seed": 3},
                        finish_reason="tool_calls", usage={"prompt_tokens": 7,
                                                           "completion_tokens": 3},
                        span=Span(start=1.5, end=2.25), node=answer, prompt_node=user,
                        flags=("malformed_tool_call",)))
    trace.set_pending([])
    yield "tool call"
    tool = trace.add_node(Message(role="tool", content="42", tool_call_id="call-1",
                                  name="calculator"), parent=answer, ids=[11, 12],
                          extra=extra(2, 3), links=[Link(target=0, type="subagent")])
    sub.add_node(Message(role="user", content="Double-check 6 * 7."), ids=[1, 2])
    done = sub.add_node(Message(role="assistant", content="42"), parent=0, sampled=True,
                        ids=[3], logprobs=np.array([-2.0], np.float32))
    sub.add_call(Call(model="m", endpoint="responses", finish_reason="stop", node=done,
                      prompt_node=0))
    final = trace.add_node(Message(role="assistant", content="42."), parent=tool, sampled=True,
                           ids=[13, 14], extra=extra(2, 4),
                           logprobs=np.array([-0.25, float("nan")], np.float32))
    trace.add_call(Call(model="m", endpoint="chat", finish_reason="stop", node=final,
                        prompt_node=tool))
    yield "answer"
    # A retry of the first question on a second branch, and a call that failed.
    retry = trace.add_node(Message(role="assistant", content="41"), parent=user,
                           sampled=True, ids=[15], logprobs=np.array([-3.0], np.float32),
                           extra=extra(1, 5))
    trace.add_call(Call(model="m", endpoint="messages", finish_reason="length", node=retry,
                        prompt_node=user))
    trace.add_node(Message(role="user", content="no tokens here"), parent=retry,
                   has_tokens=False)
    trace.add_call(Call(model="m", endpoint="chat", error="upstream 502: bad gateway",
                        prompt_node=user))
    trace.add_error("UpstreamError", "bad gateway", phase="agent")
    yield "retry"
    trace.set_reward("correct", 1.0)
    trace.set_reward("style", 0.25, weight=0.5)
    trace.metrics.update({"tool_calls": 1.0, "tokens_per_s": 123.5})
    trace.info.update({"nested": {"a": [1, 2.5, None, True]}, "token_mismatches": 0})
    trace.timing["agent"] = Span(start=1.0, end=3.5)
    trace.stop = "done"
    trace.completed = True
    sub.stop = "done"
    sub.completed = True
    yield "end"


async def handmade_records(work: Path, out: Corpus) -> None:
    from tracewire.codec import EpisodeSender, encode_frames, encode_json
    from tracewire.samples import assemble, encode_samples
    from tracewire.store import Run
    from tracewire.trace import Episode, Span

    det.reseed("handmade")
    run = await Run.create(work / "handmade", meta={"corpus": "handmade"})
    ep = Episode("handmade-1", env="corpus", task_key="t-1", task={"q": "6 * 7", "n": 1},
                 group_id="g-1", group_index=2, run="handmade")
    trace = ep.new_trace(id="main", agent={"name": "main", "version": 2})
    sub = ep.new_trace(id="sub", agent={"name": "checker"})
    ep.timing["rollout"] = Span(start=0.5)
    journal = run.journal(ep)
    sender = EpisodeSender(ep)
    deltas: list[list[bytes]] = []
    try:
        for step in _turns(trace, sub):
            if step == "end":
                ep.timing["rollout"].end = 4.0
                ep.info["note"] = "hand-made"
                ep.add_error("Timeout", "scoring took long", phase="scoring")
            for t in ep.traces:
                t.notify()  # the journal writes its delta
            d = sender.delta(final=step == "end")
            if d is not None:
                deltas.append([bytes(f) for f in encode_frames(d)])
                sender.commit(d)
        await run.flush()
        live = sorted((work / "handmade" / "live").iterdir())
        out["records/handmade/journal.twj"] = b"".join(p.read_bytes() for p in live)
        await run.append(ep)
    finally:
        journal.close()
        await run.close()
    run_files("records/handmade", work / "handmade", out)
    out["wire/handmade-deltas.msgs"] = msgspec.msgpack.encode(
        [[b"", *frames] for frames in deltas])
    out["wire/handmade-episode.msgs"] = msgspec.msgpack.encode(
        [[b"", *[bytes(f) for f in encode_frames(ep)]]])
    out["records/handmade/episode.json"] = encode_json(ep)
    for name, t in (("main", trace), ("sub", sub)):
        out[f"samples/handmade/{name}.safetensors"] = encode_samples(
            assemble(t, group_id=ep.group_id, group_index=ep.group_index), info={"t": name})
        out[f"samples/handmade/{name}-cut5.safetensors"] = encode_samples(
            assemble(t, max_seq_len=5))
