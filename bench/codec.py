"""Codec bench: one 1.825 M-token trace, and a 10,000-turn x 1,000-token episode.

Baseline: the approach of the systems we replace — pydantic models whose nodes hold Python
lists of token ids, mask bits and logprobs, packed with msgpack (``model_dump`` +
``msgpack.packb``; decode = ``unpackb`` + ``model_validate``); a stream flush re-dumps the
trace and sends the nodes past the last count.

Run: ``python bench/codec.py [--runs N]``.
"""

from __future__ import annotations

import argparse
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
from pydantic import BaseModel

sys.path.insert(0, str(Path(__file__).parent))
from _common import emit, median_ms
from tracewire import Episode, Message, Trace, codec


# -- baseline --------------------------------------------------------------------------
class BNode(BaseModel):
    parent: int | None = None
    role: str
    content: str | None = None
    token_ids: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []


class BTrace(BaseModel):
    id: str
    nodes: list[BNode] = []
    info: dict[str, Any] = {}


def b_encode(t: BTrace) -> bytes:
    return msgpack.packb(t.model_dump())  # type: ignore[no-any-return]


def b_decode(data: bytes) -> BTrace:
    return BTrace.model_validate(msgpack.unpackb(data))


def peak_mb(fn: Any) -> float:
    tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    keep = fn()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    del keep
    return (peak - base) / 1e6


def big_trace(n: int, rng: np.random.Generator) -> tuple[Trace, BTrace]:
    ids = rng.integers(0, 150_000, n).astype(np.int32)
    mask = (rng.random(n) < 0.5).astype(np.uint8)
    lps = (-rng.exponential(size=n)).astype(np.float32)
    t = Trace()
    t.add_node(Message(role="assistant", content="x"), ids=ids, mask=mask, logprobs=lps)
    b = BTrace(
        id=t.id,
        nodes=[BNode(role="assistant", content="x", token_ids=ids.tolist(), mask=mask.tolist(),
                     logprobs=lps.astype(np.float64).tolist())],
    )
    return t, b


def bench_big(runs: int) -> None:
    rng = np.random.default_rng(0)
    n = 1_825_000
    t, b = big_trace(n, rng)
    case = "trace_1825k"

    frames = codec.encode_frames(t)
    ours_enc = median_ms(lambda: codec.encode_frames(t), runs)
    wire = [bytes(f) for f in frames]  # what a receiver holds
    ours_dec = median_ms(lambda: codec.decode_frames(wire), runs)
    ours_bytes = codec.encoded_size(frames)
    rec_enc = median_ms(lambda: codec.encode_record(t), runs)
    rec = codec.record_bytes(t)
    rec_dec = median_ms(lambda: codec.decode_record(rec), runs)

    packed = b_encode(b)
    base_enc = median_ms(lambda: b_encode(b), runs)
    base_dec = median_ms(lambda: b_decode(packed), runs)

    ours_mem = peak_mb(lambda: codec.decode_frames(codec.encode_frames(t)))
    base_mem = peak_mb(lambda: b_decode(b_encode(b)))

    emit("codec", case, "encode_ms", "ms", ours_enc, base_enc, "lower", runs)
    emit("codec", case, "decode_ms", "ms", ours_dec, base_dec, "lower", runs)
    emit("codec", case, "bytes", "bytes", ours_bytes, len(packed), "lower", runs)
    emit("codec", case, "peak_mem_mb", "MB", ours_mem, base_mem, "lower", 1)
    emit("codec", case, "record_encode_ms", "ms", rec_enc, base_enc, "lower", runs)
    emit("codec", case, "record_decode_verify_ms", "ms", rec_dec, base_dec, "lower", runs)


def bench_episode(runs: int, turns: int = 10_000, per_turn: int = 1_000) -> None:
    rng = np.random.default_rng(1)
    case = "episode_10k_turns"
    e = Episode(env="bench")
    t = e.new_trace()
    sender = codec.EpisodeSender(e)
    bt = BTrace(id=t.id)
    b_sent = 0
    ids = rng.integers(0, 150_000, per_turn).astype(np.int32)
    lps = (-rng.exponential(size=per_turn)).astype(np.float32)
    ids_l, lps_l = ids.tolist(), lps.astype(np.float64).tolist()
    parent = None
    ours_delta: dict[int, float] = {}
    base_delta: dict[int, float] = {}

    def ours_flush(commit: bool = True) -> None:
        d = sender.delta()
        assert d is not None
        codec.encode_frames(d)
        if commit:
            sender.commit(d)

    def base_flush() -> None:
        nonlocal b_sent
        # Re-dump the whole trace, then send the nodes past the last count.
        dumped = bt.model_dump()
        msgpack.packb({"nodes": dumped["nodes"][b_sent:]})
        b_sent = len(dumped["nodes"])

    def base_rewind() -> None:
        nonlocal b_sent
        b_sent = len(bt.nodes) - 1

    for k in range(1, turns + 1):
        parent = t.add_node(Message(role="assistant", content="turn"), parent=parent,
                            sampled=True, ids=ids, logprobs=lps)
        bt.nodes.append(BNode(parent=parent, role="assistant", content="turn",
                              token_ids=ids_l, mask=[1] * per_turn, logprobs=lps_l))
        if k in (10, turns):
            # The cursor only advances on commit, so producing the delta of the last turn
            # again and again measures exactly "the delta after one new turn".
            ours_delta[k] = median_ms(lambda: ours_flush(commit=False), runs)
            base_delta[k] = median_ms(base_flush, runs if k < turns else 3, setup=base_rewind)
        ours_flush()
        b_sent = len(bt.nodes)

    enc = median_ms(lambda: codec.encode_frames(e), runs)
    base_enc = median_ms(lambda: b_encode(bt), 1)
    emit("codec", case, "encode_ms", "ms", enc, base_enc, "lower", runs)
    for k in (10, turns):
        emit("codec", case, f"delta_at_turn_{k}_ms", "ms", ours_delta[k], base_delta[k],
             "lower", runs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    bench_big(args.runs)
    bench_episode(args.runs)


if __name__ == "__main__":
    main()
