"""Samples bench: collecting one training sample from a session of T turns × 1,000 tokens.

Ours: the trace is recorded turn by turn with a ``SampleBuilder`` attached (as the session
server does). ``assemble_ms`` times what ``POST /samples`` does before bytes go to the
socket: ``builder.samples()`` + ``encode_parts()`` (header + the arrays' own buffers, which
the server streams uncopied). ``joined_ms`` adds the one copy into a contiguous ``bytes``
(what ``encode_samples()`` returns to Python callers).

Baseline: the reference session server's approach — one pydantic record per turn holding
the whole prompt (the prefix repeated) and the completion as Python lists; a collect packs
the records with msgpack, and the trainer unpacks them and merges them (checking each
prompt extends the merged tokens) into token/mask/logprob arrays. At T = 1,000 those
records repeat ~500 M prefix tokens (GBs of lists), so that baseline is not run (null).

Run: ``python bench/samples.py [--runs N]``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import msgpack
import numpy as np
from pydantic import BaseModel

sys.path.insert(0, str(Path(__file__).parent))
from _common import emit, median_ms
from tracewire import Call, Message, Trace
from tracewire.samples import SampleBuilder, encode_samples
from tracewire.samples._codec import encode_parts

PROMPT, COMPLETION = 200, 800  # tokens added per turn: tool result + model answer
BASELINE_MAX_TURNS = 100


class BRecord(BaseModel):
    prompt_ids: list[int]
    completion_ids: list[int]
    completion_logprobs: list[float]
    finish_reason: str


def build(turns: int, rng: np.random.Generator) -> tuple[Trace, SampleBuilder, list[BRecord]]:
    """Record ``turns`` turns the way the proxy does; keep the baseline's records too."""
    t = Trace()
    b = SampleBuilder(t).attach()
    records: list[BRecord] = []
    flat: list[int] = []
    parent: int | None = None
    for k in range(turns):
        p_ids = rng.integers(0, 50_000, PROMPT, dtype=np.int32)
        c_ids = rng.integers(0, 50_000, COMPLETION, dtype=np.int32)
        c_lp = -rng.random(COMPLETION, dtype=np.float32)
        role = "user" if k == 0 else "tool"
        pn = t.add_node(Message(role=role, content="x"), parent=parent, ids=p_ids)
        cn = t.add_node(
            Message(role="assistant", content="y"),
            parent=pn,
            sampled=True,
            ids=c_ids,
            logprobs=c_lp,
        )
        t.add_call(Call(finish_reason="tool_calls", node=cn, prompt_node=pn))
        t.notify()
        parent = cn
        if turns <= BASELINE_MAX_TURNS:
            flat.extend(p_ids.tolist())
            records.append(
                BRecord(
                    prompt_ids=list(flat),
                    completion_ids=c_ids.tolist(),
                    completion_logprobs=c_lp.tolist(),
                    finish_reason="tool_calls",
                )
            )
            flat.extend(c_ids.tolist())
    return t, b, records


def ours_collect(b: SampleBuilder) -> list[bytes | memoryview]:
    return encode_parts(b.samples(), info={"session_id": "bench"})


def ours_joined(b: SampleBuilder) -> bytes:
    return encode_samples(b.samples(), info={"session_id": "bench"})


def baseline_collect(records: list[BRecord]) -> tuple[bytes, np.ndarray, np.ndarray, np.ndarray]:
    # Server: dump the stored records; trainer: unpack and merge.
    data: bytes = msgpack.packb([r.model_dump() for r in records])
    recs = msgpack.unpackb(data)
    tokens: list[int] = []
    mask: list[int] = []
    lps: list[float] = []
    for r in recs:
        p = r["prompt_ids"]
        if p[: len(tokens)] != tokens:
            raise ValueError("prompt does not extend the merged tokens")
        gap = p[len(tokens) :]
        tokens += gap
        mask += [0] * len(gap)
        lps += [0.0] * len(gap)
        tokens += r["completion_ids"]
        mask += [1] * len(r["completion_ids"])
        lps += r["completion_logprobs"]
    return (
        data,
        np.array(tokens, np.int32),
        np.array(mask, np.uint8),
        np.array(lps, np.float32),
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=9)
    args = ap.parse_args()
    runs = args.runs
    rng = np.random.default_rng(0)
    for turns in (10, 100, 1000):
        case = f"turns_{turns}"
        _, b, records = build(turns, rng)
        payload = ours_joined(b)
        assert payload == b"".join(ours_collect(b))
        (s,) = b.samples()
        assert s.logprobs is not None
        raw = s.tokens.nbytes + s.loss_mask.nbytes + s.logprobs.nbytes
        ours_ms = median_ms(lambda b=b: ours_collect(b), runs)  # type: ignore[misc]
        joined_ms = median_ms(lambda b=b: ours_joined(b), runs)  # type: ignore[misc]
        base_ms: float | None = None
        base_bytes: float | None = None
        if records:
            data, bt, bm, bl = baseline_collect(records)
            # Same sample both ways, or the comparison means nothing.
            assert np.array_equal(bt, s.tokens) and np.array_equal(bm, s.loss_mask)
            assert np.array_equal(bl, s.logprobs)
            base_bytes = float(len(data))
            base_runs = runs if turns <= 10 else max(1, runs // 2)
            base_ms = median_ms(lambda r=records: baseline_collect(r), base_runs)  # type: ignore[misc]
        emit("samples", case, "assemble_ms", "ms", ours_ms, base_ms, "lower", runs)
        emit("samples", case, "joined_ms", "ms", joined_ms, base_ms, "lower", runs)
        emit("samples", case, "payload_bytes", "bytes", len(payload), base_bytes, "lower", runs)
        emit("samples", case, "raw_bytes", "bytes", raw, None, "lower", runs)


if __name__ == "__main__":
    main()
