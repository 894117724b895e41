"""JSON codec (orjson) for export and human reading — not for the hot path.

Columns become plain lists under ``"columns"``; NaN logprobs become ``null``. Extra columns
record their dtype and trailing shape under ``"column_types"`` so decoding restores them
exactly. Without ``float_digits`` the round trip is exact (float32 values print in their
shortest round-tripping form); with it, float columns are rounded to that many decimals.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
import orjson

from .._errors import DecodeError
from ..trace import BASE_COLUMNS, Episode, Trace
from ._headers import (
    EpisodeHeader,
    TraceHeader,
    episode_from_header,
    episode_header,
    trace_from_header,
    trace_header,
)

__all__ = ["decode_json", "encode_json", "to_builtins"]


def _column(arr: np.ndarray[Any, Any], float_digits: int | None) -> Any:
    # orjson writes numpy arrays natively: float32 in its shortest round-tripping form
    # (exact after parsing back), NaN as null.
    if arr.dtype.kind == "f" and float_digits is not None:
        return np.round(arr.astype(np.float64), float_digits)
    return np.ascontiguousarray(arr)


def _trace_dict(h: TraceHeader, float_digits: int | None) -> dict[str, Any]:
    cols = h.columns
    d: dict[str, Any] = msgspec.to_builtins(msgspec.structs.replace(h, columns={}))
    d["columns"] = {name: _column(arr, float_digits) for name, arr in cols.items()}
    types = {
        name: {"dtype": arr.dtype.str, "shape": list(arr.shape[1:])}
        for name, arr in cols.items()
        if name not in BASE_COLUMNS
    }
    if types:
        d["column_types"] = types
    return d


def to_builtins(obj: Episode | Trace, *, float_digits: int | None = None) -> dict[str, Any]:
    """The dict that :func:`encode_json` writes (columns as numpy arrays, which orjson
    serializes as lists with ``OPT_SERIALIZE_NUMPY``)."""
    if isinstance(obj, Trace):
        return _trace_dict(trace_header(obj), float_digits)
    h = episode_header(obj)
    d: dict[str, Any] = msgspec.to_builtins(msgspec.structs.replace(h, traces=[]))
    d["traces"] = [_trace_dict(t, float_digits) for t in h.traces]
    return d


def encode_json(obj: Episode | Trace, *, float_digits: int | None = None) -> bytes:
    """Encode an episode or trace as JSON bytes."""
    return orjson.dumps(
        to_builtins(obj, float_digits=float_digits), option=orjson.OPT_SERIALIZE_NUMPY
    )


def _array(values: Any, dtype: np.dtype[Any], shape: list[int]) -> np.ndarray[Any, Any]:
    if dtype.kind == "f":
        obj = np.array(values, dtype=object)
        if obj.size:
            obj[obj == None] = np.nan  # noqa: E711 - elementwise comparison on an object array
        arr = obj.astype(dtype)
    else:
        arr = np.array(values, dtype=dtype)
    n = len(values)
    return arr.reshape((n, *shape))


def _trace_from(d: dict[str, Any]) -> TraceHeader:
    cols = d.pop("columns", {}) or {}
    types = d.pop("column_types", {}) or {}
    h = msgspec.convert(d, TraceHeader)
    arrays = {}
    for name, values in cols.items():
        if name in BASE_COLUMNS:
            dt, shape = BASE_COLUMNS[name], []
        else:
            spec = types[name]
            dt, shape = np.dtype(spec["dtype"]), list(spec["shape"])
        arrays[name] = _array(values, dt, shape)
    h.columns = arrays
    return h


def decode_json(data: bytes | str) -> Episode | Trace:
    """Decode JSON from :func:`encode_json`; raises ``DecodeError`` when it is not one."""
    try:
        d = orjson.loads(data)
        if not isinstance(d, dict):
            raise DecodeError("JSON root must be an object")
        kind = d.get("type")
        if kind == "trace":
            return trace_from_header(_trace_from(d))
        if kind == "episode":
            traces = [_trace_from(t) for t in d.pop("traces", [])]
            h = msgspec.convert(d, EpisodeHeader)
            h.traces = traces
            return episode_from_header(h)
        raise DecodeError(f"unknown JSON record type {kind!r}")
    except DecodeError:
        raise
    except (orjson.JSONDecodeError, msgspec.ValidationError) as exc:
        raise DecodeError(f"malformed JSON record: {exc}") from exc
    except (KeyError, TypeError, ValueError) as exc:
        raise DecodeError(f"invalid JSON record: {exc}") from exc
