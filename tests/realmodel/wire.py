"""What crossed the wire to llama-server, parsed here with ``json`` alone (never through
tracewire's codecs), and the checks of a recorded trace against it."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from tracewire.trace import Trace

from .relay import Record


@dataclass
class Turn:
    """One ``/completion`` exchange: the prompt ids sent, the ids sampled with their
    logprobs as llama-server returned them, how it stopped, whether it was streamed."""

    prompt: list[int]
    ids: list[int]
    logprobs: list[float]
    stop_type: str
    stream: bool
    request: dict[str, Any]


def _chunks(record: Record, stream: bool) -> list[dict[str, Any]]:
    text = record.response.decode()
    if not stream:
        return [json.loads(text)]
    return [json.loads(line[len("data: "):]) for line in text.splitlines()
            if line.startswith("data: ") and line.strip() != "data: [DONE]"]


def completion_turns(records: list[Record]) -> list[Turn]:
    """Every successful ``/completion`` exchange, in order."""
    turns = []
    for r in records:
        if r.path != "/completion" or r.status != 200:
            continue
        req = json.loads(r.request)
        stream = bool(req.get("stream"))
        ids: list[int] = []
        lps: list[float] = []
        stop_type = ""
        for c in _chunks(r, stream):
            probs = list(c.get("completion_probabilities") or [])
            toks = c.get("tokens") or []
            ids += toks
            # Entries follow the ids in order; llama-server gives none for a token that
            # ends inside a multi-byte character (its logprob is then unknown: NaN).
            for tid in toks:
                if probs and probs[0]["id"] == tid:
                    lps.append(_logprob(probs.pop(0)))
                else:
                    lps.append(math.nan)
            assert not probs, "probability entries that match no sampled id"
            stop_type = c.get("stop_type") or stop_type
        prompt = req["prompt"]
        assert isinstance(prompt, list) and all(isinstance(i, int) for i in prompt)
        turns.append(Turn(prompt, ids, lps, stop_type, stream, req))
    return turns


def _logprob(entry: dict[str, Any]) -> float:
    # With post_sampling_probs the server reports the probability the token was drawn
    # with; the logprob of it is what a trace must hold.
    if "prob" in entry:
        return math.log(float(entry["prob"]))
    return float(entry["logprob"])


def f32_bits(values: Any) -> list[int]:
    """The float32 bit patterns (llama-server computes logprobs in float32 and prints them
    exactly; the trace stores float32): equality of these is bit-for-bit equality."""
    return np.asarray(values, dtype=np.float32).view(np.uint32).tolist()


def answer_calls(trace: Trace) -> list[int]:
    """The trace's calls that produced an answer node, in order (indices into calls)."""
    return [k for k, c in enumerate(trace.calls) if c.error is None and c.node is not None]


def check_against_wire(trace: Trace, turns: list[Turn]) -> int:
    """Every call of ``trace`` is exactly one turn on the wire: its branch is the prompt ids
    sent plus the ids sampled, with their logprobs bit for bit and the loss mask on them;
    each prompt extends the previous prompt + sampled ids unless the proxy re-rendered.
    Returns the number of prompts that did not extend (re-renders)."""
    calls = answer_calls(trace)
    assert len(calls) == len(turns), (len(calls), len(turns))
    rerenders = 0
    chain = 0  # the first turn since the last re-render: later prompts extend it
    for n, (k, turn) in enumerate(zip(calls, turns, strict=True)):
        if n:
            prev = turns[n - 1]
            head = prev.prompt + prev.ids
            if turn.prompt[:len(head)] != head:
                rerenders += 1
                chain = n
        call = trace.calls[k]
        assert call.node is not None
        br = trace.branch(call.node)
        ids = br.ids.tolist()
        m = len(turn.ids)
        assert m > 0
        assert ids == turn.prompt + turn.ids, f"call {k}: the branch is not the wire's ids"
        assert f32_bits(br.logprobs[-m:]) == f32_bits(turn.logprobs), f"call {k}: logprobs"
        # The loss mask is on the model's sampled ids of this chain of turns, nowhere else.
        want = np.zeros(len(ids), dtype=np.uint8)
        for t in turns[chain:n + 1]:
            want[len(t.prompt):len(t.prompt) + len(t.ids)] = 1
        since = len(turns[chain].prompt) if chain else 0
        assert br.mask[since:].tolist() == want[since:].tolist(), f"call {k}: mask"
    return rerenders
