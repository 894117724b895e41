"""The samples payload: one safetensors file, written directly (one copy of each array).

Tensors, per sample ``i``: ``tokens.{i}`` int32[L], ``loss_mask.{i}`` uint8[L] and, unless
null, ``logprobs.{i}`` float32[L] — whole-sequence arrays (response region = positions
``prompt_len:``). One more uint8 tensor ``meta`` holds a JSON object: ``format``,
``schema``, ``layout``, ``count``, ``empty_reason``, ``info`` (session-level facts) and
``samples`` (per sample: status, prompt_len, response_len, leaf, trace_id, group_id,
group_index, finish_reason, metadata, nulls, spans, empty_reason). 4-byte tensors come first
so every tensor is aligned; the file loads with ``safetensors.numpy.load``.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import orjson
from numpy.typing import NDArray

from .._errors import DecodeError, SampleError
from ._sample import Sample, SampleStatus

__all__ = [
    "FORMAT",
    "SCHEMA",
    "decode_samples",
    "encode_parts",
    "encode_samples",
    "payload_meta",
]

FORMAT = "tracewire.samples"
#: Version of the payload layout; readers refuse a higher one.
SCHEMA = 1
_LAYOUT = "full_sequence"

_ST_DTYPE: dict[str, np.dtype[Any]] = {
    "I32": np.dtype("<i4"),
    "U8": np.dtype("u1"),
    "F32": np.dtype("<f4"),
}
_FIELD_DTYPE = {"tokens": "I32", "loss_mask": "U8", "logprobs": "F32"}
_NAME = re.compile(r"^(tokens|loss_mask|logprobs)\.(\d{1,9})$")
_MAX_HEADER = 100 << 20


def _sample_meta(s: Sample) -> dict[str, Any]:
    return {
        "status": s.status,
        "prompt_len": s.prompt_len,
        "response_len": s.response_len,
        "leaf": s.leaf,
        "trace_id": s.trace_id,
        "group_id": s.group_id,
        "group_index": s.group_index,
        "finish_reason": s.finish_reason,
        "metadata": s.metadata,
        "nulls": s.nulls,
        "spans": s.spans,
        "empty_reason": s.empty_reason,
    }


def _contig(arr: NDArray[Any], dtype: np.dtype[Any], name: str) -> NDArray[Any]:
    if arr.ndim != 1:
        raise SampleError(f"{name} must be one-dimensional, got shape {arr.shape}")
    return np.ascontiguousarray(arr, dtype=dtype)


def encode_samples(samples: Sequence[Sample], *, info: Mapping[str, Any] | None = None) -> bytes:
    """Encode samples as one safetensors payload (see the module doc for the layout)."""
    # One join: each array is copied exactly once, straight into the payload.
    return b"".join(encode_parts(samples, info=info))


def encode_parts(
    samples: Sequence[Sample], *, info: Mapping[str, Any] | None = None
) -> list[bytes | memoryview]:
    """The payload as a list of buffers (header, then the arrays' own memory, uncopied)
    whose concatenation is :func:`encode_samples`'s result; a server can send them as
    they are."""
    empty = next((s.empty_reason for s in samples if s.empty_reason), None)
    meta = {
        "format": FORMAT,
        "schema": SCHEMA,
        "layout": _LAYOUT,
        "count": len(samples),
        "empty_reason": empty,
        "info": dict(info or {}),
        "samples": [_sample_meta(s) for s in samples],
    }
    try:
        meta_bytes = orjson.dumps(meta, option=orjson.OPT_SERIALIZE_NUMPY)
    except TypeError as exc:
        raise SampleError(f"sample metadata is not JSON-serializable: {exc}") from exc

    # 4-byte tensors first, then the 1-byte ones: with the header padded to 8 bytes, every
    # tensor starts aligned for its dtype and readers can map it without copying.
    wide: list[tuple[str, str, NDArray[Any]]] = []
    narrow: list[tuple[str, str, NDArray[Any]]] = []
    for i, s in enumerate(samples):
        n = int(s.tokens.shape[0])
        if s.loss_mask.shape != (n,) or (s.logprobs is not None and s.logprobs.shape != (n,)):
            raise SampleError(f"sample {i}: tokens, loss_mask and logprobs lengths differ")
        wide.append((f"tokens.{i}", "I32", _contig(s.tokens, _ST_DTYPE["I32"], "tokens")))
        if s.logprobs is not None:
            lp = _contig(s.logprobs, _ST_DTYPE["F32"], "logprobs")
            wide.append((f"logprobs.{i}", "F32", lp))
        narrow.append((f"loss_mask.{i}", "U8", _contig(s.loss_mask, _ST_DTYPE["U8"], "mask")))
    narrow.append(("meta", "U8", np.frombuffer(meta_bytes, dtype=np.uint8)))

    header: dict[str, Any] = {"__metadata__": {"format": FORMAT, "schema": str(SCHEMA)}}
    parts: list[bytes | memoryview] = []
    off = 0
    for name, dt, arr in (*wide, *narrow):
        nb = int(arr.nbytes)
        header[name] = {"dtype": dt, "shape": [int(arr.shape[0])], "data_offsets": [off, off + nb]}
        if nb:
            parts.append(arr.data.cast("B"))
        off += nb
    hb = orjson.dumps(header)
    hb += b" " * (-(8 + len(hb)) % 8)
    return [struct.pack("<Q", len(hb)) + hb, *parts]


def _parse(data: bytes | bytearray | memoryview) -> tuple[dict[str, NDArray[Any]], dict[str, Any]]:
    buf = memoryview(data).cast("B")
    total = buf.nbytes
    if total < 8:
        raise DecodeError(f"samples payload of {total} bytes is too short")
    (hlen,) = struct.unpack_from("<Q", buf, 0)
    if hlen > min(total - 8, _MAX_HEADER):
        raise DecodeError(f"samples payload header length {hlen} exceeds the payload")
    try:
        header = orjson.loads(bytes(buf[8 : 8 + hlen]))
    except orjson.JSONDecodeError as exc:
        raise DecodeError(f"samples payload header is not JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise DecodeError("samples payload header must be a JSON object")
    header.pop("__metadata__", None)
    base = 8 + hlen
    size = total - base
    arrays: dict[str, NDArray[Any]] = {}
    spans: list[tuple[int, int]] = []
    for name, entry in header.items():
        if not isinstance(entry, dict):
            raise DecodeError(f"tensor {name!r}: entry must be an object")
        dt = _ST_DTYPE.get(entry.get("dtype"))  # type: ignore[arg-type]
        shape, offs = entry.get("shape"), entry.get("data_offsets")
        if dt is None:
            raise DecodeError(f"tensor {name!r}: dtype {entry.get('dtype')!r} not allowed")
        if not (isinstance(shape, list) and len(shape) == 1 and isinstance(shape[0], int)):
            raise DecodeError(f"tensor {name!r}: shape must be [n], got {shape!r}")
        if not (
            isinstance(offs, list)
            and len(offs) == 2
            and all(isinstance(o, int) for o in offs)
            and 0 <= offs[0] <= offs[1] <= size
        ):
            raise DecodeError(f"tensor {name!r}: bad data_offsets {offs!r}")
        if offs[1] - offs[0] != shape[0] * dt.itemsize or shape[0] < 0:
            raise DecodeError(f"tensor {name!r}: {offs[1] - offs[0]} bytes for shape {shape}")
        spans.append((offs[0], offs[1]))
        arr = np.frombuffer(buf, dtype=dt, count=shape[0], offset=base + offs[0])
        arrays[name] = arr
    spans.sort()
    pos = 0
    for s, e in spans:
        if s != pos:
            raise DecodeError("samples payload tensors overlap or leave gaps")
        pos = e
    if pos != size:
        raise DecodeError(f"samples payload has {size - pos} trailing bytes")
    meta_arr = arrays.pop("meta", None)
    if meta_arr is None or meta_arr.dtype != np.uint8:
        raise DecodeError("samples payload has no uint8 'meta' tensor")
    try:
        meta = orjson.loads(meta_arr.tobytes())
    except orjson.JSONDecodeError as exc:
        raise DecodeError(f"samples meta is not JSON: {exc}") from exc
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise DecodeError("samples meta is not a tracewire.samples object")
    schema = meta.get("schema")
    if not isinstance(schema, int) or schema > SCHEMA:
        raise DecodeError(f"samples payload schema {schema!r} is newer than {SCHEMA}")
    return arrays, meta


def payload_meta(data: bytes | bytearray | memoryview) -> dict[str, Any]:
    """The decoded ``meta`` JSON of a payload (validated like :func:`decode_samples`)."""
    return _parse(data)[1]


def decode_samples(data: bytes | bytearray | memoryview) -> list[Sample]:
    """Decode a payload into samples whose arrays are read-only views of ``data``."""
    arrays, meta = _parse(data)
    entries = meta.get("samples")
    if not isinstance(entries, list) or meta.get("count") != len(entries):
        raise DecodeError("samples meta 'samples' must be a list of 'count' entries")
    for name in arrays:
        m = _NAME.match(name)
        if m is None or int(m.group(2)) >= len(entries):
            raise DecodeError(f"unexpected tensor {name!r} in samples payload")
        if _ST_DTYPE[_FIELD_DTYPE[m.group(1)]] != arrays[name].dtype:
            raise DecodeError(f"tensor {name!r} has dtype {arrays[name].dtype}")
    out: list[Sample] = []
    for i, e in enumerate(entries):
        if not isinstance(e, dict):
            raise DecodeError(f"samples meta entry {i} must be an object")
        try:
            tokens, mask = arrays[f"tokens.{i}"], arrays[f"loss_mask.{i}"]
        except KeyError as exc:
            raise DecodeError(f"sample {i}: missing tensor {exc.args[0]}") from exc
        nulls = e.get("nulls") or []
        lp = arrays.get(f"logprobs.{i}")
        if (lp is None) != ("logprobs" in nulls):
            raise DecodeError(f"sample {i}: logprobs presence disagrees with nulls {nulls!r}")
        n = tokens.shape[0]
        if mask.shape[0] != n or (lp is not None and lp.shape[0] != n):
            raise DecodeError(f"sample {i}: tensor lengths differ")
        try:
            prompt_len = int(e["prompt_len"])
            if not 0 <= prompt_len <= n or int(e.get("response_len", n - prompt_len)) != (
                n - prompt_len
            ):
                raise DecodeError(f"sample {i}: prompt_len {prompt_len} outside 0..{n}")
            out.append(
                Sample(
                    tokens=tokens,
                    loss_mask=mask,
                    logprobs=lp,
                    status=SampleStatus(e["status"]),
                    prompt_len=prompt_len,
                    leaf=int(e.get("leaf", -1)),
                    trace_id=str(e.get("trace_id") or ""),
                    group_id=e.get("group_id"),
                    group_index=int(e.get("group_index") or 0),
                    finish_reason=e.get("finish_reason"),
                    metadata=dict(e.get("metadata") or {}),
                    spans=[(int(a), int(b), int(c)) for a, b, c in e.get("spans") or []],
                    empty_reason=e.get("empty_reason"),
                )
            )
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, DecodeError):
                raise
            raise DecodeError(f"sample {i}: bad meta entry: {exc!r}") from exc
    return out
