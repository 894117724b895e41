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
    #: Whether the client got the whole answer (False: it hung up, refusing the reply).
    delivered: bool = True
    #: Ids the server sampled but never sent (streamed: a token ending inside a multi-byte
    #: character is held back and its id never appears; ``tokens_predicted`` counts it).
    withheld: int = 0

    @property
    def refused(self) -> bool:
        """The proxy could not record this answer (and said so to its client)."""
        return not self.delivered or self.withheld > 0


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
        predicted = 0
        for c in _chunks(r, stream):
            predicted = max(predicted, int(c.get("tokens_predicted") or 0))
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
        turns.append(Turn(prompt, ids, lps, stop_type, stream, req, r.delivered,
                          max(0, predicted - len(ids)) if stream else 0))
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


@dataclass
class Checked:
    """What :func:`check_against_wire` found: where the next trace's turns start, the
    prompts that did not extend the previous one, the failed calls' errors."""

    at: int
    rerenders: int
    errors: list[str]


def check_against_wire(trace: Trace, turns: list[Turn], at: int = 0) -> Checked:
    """Every answered call of ``trace`` is exactly one exchange on the wire (from ``turns[at]``
    on, in order): its branch is the prompt ids sent plus the ids sampled, with their
    logprobs bit for bit and the loss mask on them; each prompt extends the previous
    prompt + sampled ids unless the proxy re-rendered. A failed call may own one exchange
    only if that answer was refused on the wire (the client hung up, or ids were withheld);
    no other exchange goes unaccounted for."""
    rerenders = 0
    errors: list[str] = []
    done: list[Turn] = []  # the answered calls' turns, in order
    chain = 0  # index in ``done`` of the first turn since the last re-render
    failed = 0  # failed calls since the last answered one

    def skip_refused(limit: int) -> None:
        nonlocal at
        while limit and at < len(turns) and turns[at].refused:
            at, limit = at + 1, limit - 1

    for k, call in enumerate(trace.calls):
        if call.error is not None or call.node is None:
            errors.append(call.error or "no answer node")
            failed += 1
            continue
        skip_refused(failed)
        failed = 0
        assert at < len(turns), f"call {k} has no exchange on the wire"
        turn = turns[at]
        at += 1
        if turn.refused and "stream_resumed_unstreamed" in call.flags:
            # The stream lost ids; the proxy asked for the rest unstreamed, from the ids it
            # had: one answer over two exchanges.
            assert at < len(turns), f"call {k}: no resumed exchange"
            rest = turns[at]
            at += 1
            kept = rest.prompt[len(turn.prompt):]
            assert rest.prompt[:len(turn.prompt)] == turn.prompt and not rest.stream
            assert turn.ids[:len(kept)] == kept, f"call {k}: resumed from other ids"
            turn = Turn(turn.prompt, kept + rest.ids, turn.logprobs[:len(kept)] +
                        rest.logprobs, rest.stop_type, True, turn.request)
        assert not turn.refused, f"call {k} was recorded from a refused answer"
        if done:
            head = done[-1].prompt + done[-1].ids
            if turn.prompt[:len(head)] != head:
                rerenders += 1
                chain = len(done)
        done.append(turn)
        br = trace.branch(call.node)
        ids = br.ids.tolist()
        m = len(turn.ids)
        assert m > 0
        assert ids == turn.prompt + turn.ids, f"call {k}: the branch is not the wire's ids"
        assert f32_bits(br.logprobs[-m:]) == f32_bits(turn.logprobs), f"call {k}: logprobs"
        # The loss mask is on the model's sampled ids of this chain of turns, nowhere else.
        want = np.zeros(len(ids), dtype=np.uint8)
        for t in done[chain:]:
            want[len(t.prompt):len(t.prompt) + len(t.ids)] = 1
        since = len(done[chain].prompt) if chain else 0
        assert br.mask[since:].tolist() == want[since:].tolist(), f"call {k}: mask"
    skip_refused(failed)
    return Checked(at, rerenders, errors)
