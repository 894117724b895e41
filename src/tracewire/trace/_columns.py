"""Growable typed token columns: one contiguous array per column, appended in place.

A trace's tokens live here, never in Python lists: ids ``int32``, mask ``uint8`` (1 = sampled
by the model and trainable), logprobs ``float32`` (NaN where not sampled), plus any named
extra columns of any numeric dtype and trailing shape. Appends double the capacity when
full, so appending is amortized O(new tokens); reads return numpy views of the filled part.
Because columns are append-only, a view handed out earlier stays valid and never changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, DTypeLike, NDArray

__all__ = ["BASE_COLUMNS", "Columns"]

#: The three columns every trace has, with their dtypes.
BASE_COLUMNS: dict[str, np.dtype[Any]] = {
    "ids": np.dtype(np.int32),
    "mask": np.dtype(np.uint8),
    "logprobs": np.dtype(np.float32),
}
_MIN_CAPACITY = 256


def _grow(arr: NDArray[Any], n: int, need: int) -> NDArray[Any]:
    cap = max(need, 2 * arr.shape[0], _MIN_CAPACITY)
    new = np.empty((cap, *arr.shape[1:]), dtype=arr.dtype)
    new[:n] = arr[:n]
    return new


class Columns:
    """Token columns of one trace; ``len(columns)`` is the number of tokens."""

    __slots__ = ("_arrays", "_cap", "_n")

    def __init__(self) -> None:
        self._arrays: dict[str, NDArray[Any]] = {
            name: np.empty(0, dtype=dt) for name, dt in BASE_COLUMNS.items()
        }
        self._n = 0
        # Rows every array can hold, all writeable (0: unknown, check in _reserve). Lets
        # append skip the per-column capacity check, which dominated small appends.
        self._cap = 0

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, NDArray[Any]]) -> Columns:
        """Adopt existing arrays (e.g. ``np.frombuffer`` views) without copying them.

        ``arrays`` must hold at least ``ids``; missing base columns are filled with their
        defaults. All arrays must have the same first dimension.
        """
        if "ids" not in arrays:
            raise ValueError("columns need an 'ids' array")
        n = int(arrays["ids"].shape[0])
        self = cls()
        for name, arr in arrays.items():
            if arr.shape[:1] != (n,):
                raise ValueError(f"column {name!r} has {arr.shape[:1]} rows, ids has {n}")
            want = BASE_COLUMNS.get(name)
            if want is not None and arr.dtype != want:
                raise ValueError(f"column {name!r} must be {want}, got {arr.dtype}")
            self._arrays[name] = arr
        self._cap = 0  # adopted arrays may be read-only
        if "mask" not in arrays:
            self._arrays["mask"] = np.zeros(n, dtype=np.uint8)
        if "logprobs" not in arrays:
            self._arrays["logprobs"] = np.full(n, np.nan, dtype=np.float32)
        self._n = n
        return self

    def __len__(self) -> int:
        return self._n

    def __repr__(self) -> str:
        return f"Columns(n={self._n}, names={self.names()})"

    @property
    def ids(self) -> NDArray[np.int32]:
        """Token ids, ``int32[T]`` (a view)."""
        return self._arrays["ids"][: self._n]

    @property
    def mask(self) -> NDArray[np.uint8]:
        """Loss mask, ``uint8[T]``: 1 where the model sampled the token (a view)."""
        return self._arrays["mask"][: self._n]

    @property
    def logprobs(self) -> NDArray[np.float32]:
        """Sampled log-probabilities, ``float32[T]``, NaN where not sampled (a view)."""
        return self._arrays["logprobs"][: self._n]

    def names(self) -> list[str]:
        """Column names: ``ids``, ``mask``, ``logprobs``, then the extras in creation order."""
        return list(self._arrays)

    def extra_names(self) -> list[str]:
        """Names of the extra (non-base) columns."""
        return [n for n in self._arrays if n not in BASE_COLUMNS]

    def column(self, name: str) -> NDArray[Any]:
        """The filled part of column ``name`` (a view); ``KeyError`` if there is none."""
        return self._arrays[name][: self._n]

    def arrays(self) -> dict[str, NDArray[Any]]:
        """Every column as a view of its filled part, keyed by name."""
        n = self._n
        return {name: arr[:n] for name, arr in self._arrays.items()}

    def slice(self, start: int, end: int) -> dict[str, NDArray[Any]]:
        """Every column's rows ``[start, end)`` as views."""
        if not 0 <= start <= end <= self._n:
            raise IndexError(f"slice [{start}, {end}) outside 0..{self._n}")
        return {name: arr[start:end] for name, arr in self._arrays.items()}

    def add_column(self, name: str, dtype: DTypeLike, shape: tuple[int, ...] = ()) -> None:
        """Create an extra column; rows that already exist are zero-filled."""
        if name in self._arrays:
            raise ValueError(f"column {name!r} already exists")
        cap = max(self._arrays["ids"].shape[0], self._n)
        self._arrays[name] = np.zeros((cap, *shape), dtype=dtype)
        self._cap = 0

    def append(
        self,
        ids: ArrayLike,
        mask: ArrayLike | int = 0,
        logprobs: ArrayLike | None = None,
        extra: Mapping[str, ArrayLike] | None = None,
    ) -> tuple[int, int]:
        """Append tokens and return their slice ``(start, end)``.

        ``mask`` may be a scalar applied to all new tokens; ``logprobs`` defaults to NaN.
        Extra columns not given are zero-filled; unknown extra names create the column.
        """
        ids_arr = np.asarray(ids, dtype=np.int32)
        if ids_arr.ndim != 1:
            raise ValueError("ids must be one-dimensional")
        start = self._n
        end = start + ids_arr.shape[0]
        arrs = self._arrays
        if extra:
            for name, values in extra.items():
                if name not in arrs:
                    v = np.asarray(values)
                    self.add_column(name, v.dtype, tuple(v.shape[1:]))
        if end > self._cap:
            self._reserve(end)
        arrs["ids"][start:end] = ids_arr
        arrs["mask"][start:end] = mask
        if logprobs is None:
            arrs["logprobs"][start:end] = np.nan
        else:
            arrs["logprobs"][start:end] = logprobs
        if len(arrs) > len(BASE_COLUMNS):
            for name in self.extra_names():
                if extra is not None and name in extra:
                    arrs[name][start:end] = extra[name]
                else:
                    arrs[name][start:end] = 0
        self._n = end
        return start, end

    def extend(self, arrays: Mapping[str, NDArray[Any]]) -> tuple[int, int]:
        """Append rows given as a full set of named arrays (the form deltas carry)."""
        ids = arrays["ids"]
        extra = {k: v for k, v in arrays.items() if k not in BASE_COLUMNS}
        return self.append(ids, arrays.get("mask", 0), arrays.get("logprobs"), extra or None)

    def reserve(self, rows: int) -> None:
        """Make room for ``rows`` tokens in total, so appends up to there never reallocate.

        A capacity hint for writers that know their budget; contents are unchanged.
        """
        if rows > self._cap:
            self._reserve(rows)

    def _reserve(self, need: int) -> None:
        arrays = self._arrays
        for name, arr in arrays.items():
            if arr.shape[0] < need or not arr.flags.writeable:
                arrays[name] = _grow(arr, self._n, need)
        self._cap = min(arr.shape[0] for arr in arrays.values())
