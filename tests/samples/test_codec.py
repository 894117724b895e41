"""The safetensors payload: loads with the safetensors library and equals the samples."""

from __future__ import annotations

import struct

import numpy as np
import orjson
import pytest
import safetensors.numpy as stn

from tracewire import DecodeError, SampleError, Trace
from tracewire.samples import Sample, assemble, decode_samples, encode_samples, payload_meta
from tracewire.samples._codec import encode_parts

from .builders import complete, golden, prompt


def tree() -> Trace:
    t = golden()
    p = prompt(t, 1, [("assistant", "x"), ("user", "y")], [7, 8, 9])  # fork after turn 1
    complete(t, p, [40, 41, 42], None, "length")  # no logprobs: null
    return t


def assert_same(a: list[Sample], b: list[Sample]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.equals(y), (x, y)


def test_payload_loads_with_safetensors_and_equals_samples() -> None:
    t = tree()
    samples = assemble(t, metadata={"task": "t1"}, group_id="g", group_index=3)
    assert len(samples) == 2
    data = encode_samples(samples, info={"session_id": "abc"})
    loaded = stn.load(data)
    assert set(loaded) == {
        "tokens.0",
        "loss_mask.0",
        "logprobs.0",
        "tokens.1",
        "loss_mask.1",
        "meta",
    }
    for i, s in enumerate(samples):
        assert loaded[f"tokens.{i}"].dtype == np.int32
        assert loaded[f"loss_mask.{i}"].dtype == np.uint8
        assert np.array_equal(loaded[f"tokens.{i}"], s.tokens)
        assert np.array_equal(loaded[f"loss_mask.{i}"], s.loss_mask)
    assert samples[0].logprobs is not None
    assert loaded["logprobs.0"].dtype == np.float32
    assert np.array_equal(loaded["logprobs.0"], samples[0].logprobs)
    meta = orjson.loads(loaded["meta"].tobytes())
    assert meta["format"] == "tracewire.samples" and meta["schema"] == 1
    assert meta["count"] == 2 and meta["empty_reason"] is None
    assert meta["info"] == {"session_id": "abc"}
    m1 = meta["samples"][1]
    assert m1["nulls"] == ["logprobs"] and m1["status"] == "truncated"
    assert (m1["group_id"], m1["group_index"]) == ("g", 3)
    assert m1["metadata"]["task"] == "t1"
    assert m1["response_len"] == len(samples[1].tokens) - samples[1].prompt_len
    assert payload_meta(data) == meta
    # Our decoder gives back exactly the samples.
    assert_same(decode_samples(data), samples)
    # The uncopied buffers a server streams are the same bytes.
    assert b"".join(encode_parts(samples, info={"session_id": "abc"})) == data


def test_decoder_reads_files_written_by_safetensors() -> None:
    samples = assemble(tree())
    loaded = stn.load(encode_samples(samples))
    data = stn.save(loaded)  # re-written by the library, its own tensor order
    assert_same(decode_samples(data), samples)


def test_empty_result_round_trips() -> None:
    samples = assemble(Trace())
    data = encode_samples(samples)
    assert payload_meta(data)["empty_reason"] == "no_records"
    loaded = stn.load(data)
    assert loaded["tokens.0"].shape == (0,)
    assert_same(decode_samples(data), samples)


def test_alignment_of_wide_tensors() -> None:
    data = encode_samples(assemble(tree()))
    (hlen,) = struct.unpack_from("<Q", data, 0)
    header = orjson.loads(data[8 : 8 + hlen])
    assert (8 + hlen) % 8 == 0
    for name, e in header.items():
        if name != "__metadata__" and e["dtype"] in ("I32", "F32"):
            assert e["data_offsets"][0] % 4 == 0


def test_payload_size_is_close_to_raw_bytes() -> None:
    t = Trace()
    p = prompt(t, None, [("user", "u")], list(range(5000)))
    complete(t, p, list(range(5000)), [-0.5] * 5000, "stop")
    samples = assemble(t)
    raw = sum(s.tokens.nbytes + s.loss_mask.nbytes for s in samples) + sum(
        s.logprobs.nbytes for s in samples if s.logprobs is not None
    )
    assert len(encode_samples(samples)) <= 1.1 * raw


def test_unserializable_metadata_is_a_sample_error() -> None:
    with pytest.raises(SampleError, match="JSON"):
        encode_samples(assemble(golden(), overrides={"x": object()}))


def _corrupt(data: bytes, header: dict[str, object]) -> bytes:
    (hlen,) = struct.unpack_from("<Q", data, 0)
    hb = orjson.dumps(header)
    return struct.pack("<Q", len(hb)) + hb + data[8 + hlen :]


def test_malformed_payloads_raise_decode_error() -> None:
    data = encode_samples(assemble(golden()))
    (hlen,) = struct.unpack_from("<Q", data, 0)
    header = orjson.loads(data[8 : 8 + hlen])
    bad: list[bytes] = [
        b"",
        b"\x01\x02",
        struct.pack("<Q", 10**12) + b"{}",
        struct.pack("<Q", 2) + b"[]",
        struct.pack("<Q", 3) + b"{x}",
        data[:-1],  # truncated
        data + b"\x00",  # trailing byte
        _corrupt(data, {**header, "tokens.0": {**header["tokens.0"], "dtype": "F64"}}),
        _corrupt(data, {**header, "tokens.0": {**header["tokens.0"], "shape": [1, 2]}}),
        _corrupt(data, {**header, "tokens.0": {**header["tokens.0"], "data_offsets": [0, 10**9]}}),
        _corrupt(data, {k: v for k, v in header.items() if k != "meta"}),
        _corrupt(data, {k: v for k, v in header.items() if k != "tokens.0"}),
        stn.save({"meta": np.frombuffer(b'{"format": "other"}', np.uint8)}),
        stn.save({"meta": np.frombuffer(b"not json", np.uint8)}),
        stn.save(
            {"meta": np.frombuffer(b'{"format": "tracewire.samples", "schema": 99}', np.uint8)}
        ),
        stn.save(
            {
                "meta": np.frombuffer(
                    b'{"format": "tracewire.samples", "schema": 1, "count": 1, "samples": []}',
                    np.uint8,
                )
            }
        ),
    ]
    for i, b in enumerate(bad):
        with pytest.raises(DecodeError):
            decode_samples(b)
            pytest.fail(f"payload {i} decoded")
    # Tensors that disagree with the meta.
    loaded = stn.load(data)
    loaded["loss_mask.0"] = loaded["loss_mask.0"][:-1].copy()
    with pytest.raises(DecodeError, match="lengths"):
        decode_samples(stn.save(loaded))
    loaded = stn.load(data)
    loaded["extra.0"] = np.zeros(1, np.uint8)
    with pytest.raises(DecodeError, match="unexpected"):
        decode_samples(stn.save(loaded))
    loaded = stn.load(data)
    del loaded["logprobs.0"]
    with pytest.raises(DecodeError, match="nulls"):
        decode_samples(stn.save(loaded))
    loaded = stn.load(data)
    loaded["tokens.0"] = loaded["tokens.0"].astype(np.float32)
    with pytest.raises(DecodeError, match="dtype"):
        decode_samples(stn.save(loaded))
