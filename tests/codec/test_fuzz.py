"""Malformed, truncated, version-mismatched and CRC-failing bytes only raise DecodeError."""

from __future__ import annotations

import random
import struct

import msgspec
import numpy as np
import pytest

from tracewire import DecodeError, Message, SchemaVersionError, Trace, codec


def _sample_records() -> list[bytes]:
    out = []
    for seed in range(5):
        rng = np.random.default_rng(seed)
        t = Trace()
        parent = None
        for k in range(4):
            n = int(rng.integers(0, 30))
            parent = t.add_node(
                Message(role="assistant" if k % 2 else "user", content="é" * k),
                parent=parent,
                sampled=bool(k % 2),
                ids=rng.integers(0, 5000, n),
                logprobs=-rng.random(n),
                extra={"adv": rng.random((n, 2)).astype(np.float32)} if seed % 2 else None,
            )
        t.set_reward("r", 1.0)
        out.append(codec.record_bytes(t))
    return out


def _mutate(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    choice = rng.randrange(6)
    if choice == 0 and b:  # flip bits
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
    elif choice == 1:  # truncate
        del b[rng.randrange(len(b) + 1) :]
    elif choice == 2:  # insert junk
        i = rng.randrange(len(b) + 1)
        b[i:i] = rng.randbytes(rng.randint(1, 16))
    elif choice == 3 and b:  # delete a span
        i = rng.randrange(len(b))
        del b[i : i + rng.randint(1, 16)]
    elif choice == 4:  # random bytes
        b = bytearray(rng.randbytes(rng.randint(0, 200)))
    else:  # overwrite a prefix field with a random value
        if len(b) >= 32:
            off = rng.choice([4, 8, 12, 16])
            size = 8 if off == 16 else 4
            b[off : off + size] = rng.randbytes(size)
    return bytes(b)


def test_ten_thousand_mutated_records_only_raise_decode_error() -> None:
    rng = random.Random(1234)
    samples = _sample_records()
    decoded = failed = 0
    for _ in range(10_000):
        data = _mutate(rng, rng.choice(samples))
        verify = rng.random() < 0.5
        try:
            codec.decode_record(data, verify=verify)
            decoded += 1
        except DecodeError:
            failed += 1
    assert failed > 9_000  # nearly every mutation is caught (CRC or framing)
    assert decoded + failed == 10_000


def test_mutated_frames_without_crc_only_raise_decode_error() -> None:
    """Frames carry no CRC, so mutations reach the header parser and validators."""
    rng = random.Random(99)
    t = Trace()
    a = t.add_node(Message(role="user", content="hi"), ids=[1, 2, 3])
    t.add_node(Message(role="assistant", content="yo"), parent=a, sampled=True, ids=[4])
    frames = [bytes(f) for f in codec.encode_frames(t)]
    caught = 0
    for _ in range(3_000):
        k = rng.randrange(len(frames))
        mutated = list(frames)
        mutated[k] = _mutate(rng, frames[k])
        if rng.random() < 0.1:
            mutated = mutated[: rng.randrange(len(mutated) + 1)]
        try:
            codec.decode_frames(mutated)
        except DecodeError:
            caught += 1
    assert caught > 0


def _raw_header(obj: dict[str, object]) -> bytes:
    return struct.pack("<2sH", b"TW", 1) + msgspec.msgpack.encode(obj)


@pytest.mark.parametrize(
    ("header", "buffers", "message"),
    [
        ({"type": "trace", "id": "t", "nodes": [{"message": {"role": "u"}, "end": 5}]}, [],
         "outside"),
        ({"type": "trace", "id": "t", "nodes": [{"message": {"role": "u"}, "parent": 0}]}, [],
         "parent"),
        ({"type": "trace", "id": "t", "columns": {"ids": [0, "<i4", [2]]}}, [b"abc"], "bytes"),
        ({"type": "trace", "id": "t", "columns": {"ids": [0, "|O", [1]]}}, [b"12345678"],
         "dtype"),
        ({"type": "trace", "id": "t", "columns": {"ids": [3, "<i4", [1]]}}, [b"1234"], "missing"),
        ({"type": "trace", "id": "t", "columns": {"ids": [0, "<f4", [1]]}}, [b"1234"], "ids"),
        ({"type": "trace", "id": "t"}, [b"extra"], "buffers"),
        ({"type": "nope", "id": "t"}, [], "malformed"),
        ({"type": "trace", "id": "t", "calls": [{"node": 3}]}, [], "missing node"),
    ],
)
def test_invalid_headers_say_what_is_wrong(
    header: dict[str, object], buffers: list[bytes], message: str
) -> None:
    with pytest.raises(DecodeError, match=message):
        codec.decode_frames([_raw_header(header), *buffers])


def test_schema_version_mismatch_is_reported() -> None:
    t = Trace()
    frames = codec.encode_frames(t)
    newer = struct.pack("<2sH", b"TW", 99) + bytes(frames[0])[4:]
    with pytest.raises(SchemaVersionError, match="schema version 99"):
        codec.decode_frames([newer])
    rec = bytearray(codec.record_bytes(t))
    rec[4:6] = struct.pack("<H", 99)
    with pytest.raises(SchemaVersionError):
        codec.decode_record(bytes(rec), verify=False)
    assert issubclass(SchemaVersionError, ValueError)


def test_crc_failures_are_reported() -> None:
    t = Trace()
    t.add_node(Message(role="user"), ids=np.arange(100))
    rec = bytearray(codec.record_bytes(t))
    rec[-5] ^= 0xFF
    with pytest.raises(DecodeError, match="buffers fail their CRC"):
        codec.decode_record(bytes(rec))
    rec = bytearray(codec.record_bytes(t))
    rec[40] ^= 0x01
    with pytest.raises(DecodeError, match="header fails its CRC"):
        codec.decode_record(bytes(rec))


def test_bad_json_raises_decode_error() -> None:
    for data in [b"", b"[]", b'{"type": "x"}', b'{"type": "trace"}', b"{",
                 b'{"type":"trace","id":"t","columns":{"extra":[1]}}']:
        with pytest.raises(DecodeError):
            codec.decode_json(data)
