"""How numpy arrays inside msgspec headers become separate raw buffers, and back.

Headers are msgspec Structs whose array-typed fields are encoded as a small reference
``[buffer_index, dtype, shape]``; the array's memory itself is appended to a side list of
buffers (no copy). Decoding turns each reference back into ``np.frombuffer`` over the
matching buffer (no copy). The side lists are per thread, so one module-level Encoder and
Decoder serve every thread.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = ["Buffer", "arrays_state", "dec_hook", "enc_hook"]

#: Anything exposing the buffer protocol: bytes, bytearray, memoryview, zmq frames' buffers.
Buffer = bytes | bytearray | memoryview

# Only plain little-endian numeric dtypes cross the wire; anything else is refused.
_DTYPES: dict[str, np.dtype[Any]] = {
    np.dtype(c).newbyteorder("<").str: np.dtype(c).newbyteorder("<")
    for c in ("?", "i1", "u1", "i2", "u2", "i4", "u4", "i8", "u8", "f2", "f4", "f8")
}
_MAX_NDIM = 8


class _State(threading.local):
    def __init__(self) -> None:
        self.out: list[Buffer] = []
        self.inp: Sequence[Buffer] = ()
        self.used = 0


arrays_state = _State()


def _as_buffer(arr: NDArray[Any]) -> Buffer:
    arr = np.ascontiguousarray(arr)
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    return memoryview(arr).cast("B") if arr.size else b""  # type: ignore[arg-type]


def enc_hook(obj: Any) -> Any:
    """msgspec hook: move an ndarray's memory to the side list, encode a reference."""
    if isinstance(obj, np.ndarray):
        state = arrays_state
        state.out.append(_as_buffer(obj))
        return [len(state.out) - 1, obj.dtype.newbyteorder("<").str, list(obj.shape)]
    if isinstance(obj, np.generic):
        return obj.item()
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


def _dtype(s: Any) -> np.dtype[Any]:
    # A closed list: np.dtype() of arbitrary strings accepts far too much (and warns).
    dt = _DTYPES.get(s) if isinstance(s, str) else None
    if dt is None:
        raise ValueError(f"dtype {s!r} is not allowed")
    return dt


def dec_hook(type_: type, obj: Any) -> Any:
    """msgspec hook: turn a ``[index, dtype, shape]`` reference into a zero-copy array."""
    if type_ is not np.ndarray:
        raise NotImplementedError(f"cannot decode {type_!r}")
    if not (isinstance(obj, list) and len(obj) == 3):
        raise ValueError("array reference must be [buffer, dtype, shape]")
    index, dts, shape = obj
    state = arrays_state
    if not isinstance(index, int) or not 0 <= index < len(state.inp):
        raise ValueError(f"array reference to missing buffer {index!r}")
    if (
        not isinstance(shape, list)
        or len(shape) > _MAX_NDIM
        or not all(isinstance(d, int) and d >= 0 for d in shape)
    ):
        raise ValueError(f"bad array shape {shape!r}")
    dt = _dtype(dts)
    buf = state.inp[index]
    count = 1
    for d in shape:
        count *= d
    nbytes = memoryview(buf).nbytes
    if count * dt.itemsize != nbytes:
        raise ValueError(
            f"buffer {index} holds {nbytes} bytes, {dts}{tuple(shape)} needs {count * dt.itemsize}"
        )
    state.used += 1
    return np.frombuffer(buf, dtype=dt).reshape(shape)
