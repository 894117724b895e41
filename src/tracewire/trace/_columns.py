"""Growable typed token columns: one contiguous array per column, appended in place.

A trace's tokens live here, never in Python lists: ids ``int32``, mask ``uint8`` (1 = sampled
by the model and trainable), logprobs ``float32`` (NaN where not sampled), plus any named
extra columns of any numeric dtype and trailing shape. Appends double the capacity when
full, so appending is amortized O(new tokens); reads return numpy views of the filled part.
Because columns are append-only, a view handed out earlier stays valid and never changes.
"""

from __future__ import annotations

from array import array
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
#: The buffer formats of the base columns as memoryviews see them (``_views``).
_VIEW_FORMATS = ("i", "B", "f")
_NAN_F = array("f", [float("nan")])


def _grow(arr: NDArray[Any], n: int, need: int) -> NDArray[Any]:
    cap = max(need, 2 * arr.shape[0], _MIN_CAPACITY)
    new = np.empty((cap, *arr.shape[1:]), dtype=arr.dtype)
    new[:n] = arr[:n]
    return new


def _rows(arrays: Mapping[str, NDArray[Any]]) -> int:
    """Rows of named column arrays; ``ValueError`` unless ``ids`` is one-dimensional, every
    column has as many rows and the base columns have their dtypes."""
    ids = arrays.get("ids")
    if ids is None or ids.ndim != 1:
        raise ValueError("columns need a one-dimensional 'ids' array")
    rows = int(ids.shape[0])
    for name, arr in arrays.items():
        if arr.shape[:1] != (rows,):
            raise ValueError(f"column {name!r} has {arr.shape[:1]} rows, ids has {rows}")
        want = BASE_COLUMNS.get(name)
        if want is not None and arr.dtype != want:
            raise ValueError(f"column {name!r} must be {want}, got {arr.dtype}")
    return rows


class Columns:
    """Token columns of one trace; ``len(columns)`` is the number of tokens."""

    __slots__ = ("_arrays", "_cap", "_n", "_pending", "_pending_rows", "_views")

    def __init__(self) -> None:
        self._arrays: dict[str, NDArray[Any]] = {
            name: np.empty(0, dtype=dt) for name, dt in BASE_COLUMNS.items()
        }
        self._n = 0
        # Rows every array can hold, all writeable (0: unknown, check in _reserve). Lets
        # append skip the per-column capacity check, which dominated small appends.
        self._cap = 0
        # Chunks given to extend() and not yet copied in: a receiver assembling deltas
        # copies them once, into an exactly sized buffer, when the columns are first read
        # (a single chunk into empty columns is adopted without any copy).
        self._pending: list[Mapping[str, NDArray[Any]]] = []
        self._pending_rows = 0
        # Writeable memoryviews of ids, mask and logprobs, made by _reserve (None: make them
        # there; False: the formats do not match, use numpy). A proxy turn appends a few
        # Python ints per node: through these, no numpy call at all (each costs ~3k
        # instructions and, run once a turn, cold cache lines).
        self._views: tuple[memoryview, memoryview, memoryview] | bool | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Memoryviews do not pickle or copy; they are made again on the next append.
        return {k: getattr(self, k) for k in self.__slots__ if k != "_views"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for k, v in state.items():
            setattr(self, k, v)
        self._views = None

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, NDArray[Any]]) -> Columns:
        """Adopt existing arrays (e.g. ``np.frombuffer`` views) without copying them.

        ``arrays`` must hold at least ``ids``; missing base columns are filled with their
        defaults. All arrays must have the same first dimension.
        """
        n = _rows(arrays)
        self = cls()
        self._arrays.update(arrays)
        self._cap = 0  # adopted arrays may be read-only
        self._views = None
        if "mask" not in arrays:
            self._arrays["mask"] = np.zeros(n, dtype=np.uint8)
        if "logprobs" not in arrays:
            self._arrays["logprobs"] = np.full(n, np.nan, dtype=np.float32)
        self._n = n
        return self

    def __len__(self) -> int:
        return self._n + self._pending_rows

    def __repr__(self) -> str:
        return f"Columns(n={len(self)}, names={self.names()})"

    @property
    def ids(self) -> NDArray[np.int32]:
        """Token ids, ``int32[T]`` (a view)."""
        if self._pending:
            self._flush()
        return self._arrays["ids"][: self._n]

    @property
    def mask(self) -> NDArray[np.uint8]:
        """Loss mask, ``uint8[T]``: 1 where the model sampled the token (a view)."""
        if self._pending:
            self._flush()
        return self._arrays["mask"][: self._n]

    @property
    def logprobs(self) -> NDArray[np.float32]:
        """Sampled log-probabilities, ``float32[T]``, NaN where not sampled (a view)."""
        if self._pending:
            self._flush()
        return self._arrays["logprobs"][: self._n]

    def ids_bytes(self, start: int, end: int) -> bytes:
        """The int32 ids of rows ``[start, end)`` as bytes (what comparing a few ids with a
        parsed tail needs, without a numpy call when the columns were appended to)."""
        if self._pending:
            self._flush()
        if not 0 <= start <= end <= self._n:
            raise IndexError(f"rows [{start}, {end}) outside 0..{self._n}")
        views = self._views
        if isinstance(views, tuple):
            return views[0][start:end].tobytes()
        return self._arrays["ids"][start:end].tobytes()

    def names(self) -> list[str]:
        """Column names: ``ids``, ``mask``, ``logprobs``, then the extras in creation order."""
        if self._pending:
            self._flush()
        return list(self._arrays)

    def spec(self, name: str) -> tuple[np.dtype[Any], tuple[int, ...]] | None:
        """Dtype and trailing shape of column ``name`` (None if absent), without copying in
        pending chunks."""
        arr = self._arrays.get(name)
        if arr is None:
            arr = next((c[name] for c in self._pending if name in c), None)
        return None if arr is None else (arr.dtype, tuple(arr.shape[1:]))

    def extra_names(self) -> list[str]:
        """Names of the extra (non-base) columns."""
        if self._pending:
            self._flush()
        return [n for n in self._arrays if n not in BASE_COLUMNS]

    def column(self, name: str) -> NDArray[Any]:
        """The filled part of column ``name`` (a view); ``KeyError`` if there is none."""
        if self._pending:
            self._flush()
        return self._arrays[name][: self._n]

    def arrays(self) -> dict[str, NDArray[Any]]:
        """Every column as a view of its filled part, keyed by name."""
        if self._pending:
            self._flush()
        n = self._n
        return {name: arr[:n] for name, arr in self._arrays.items()}

    def slice(self, start: int, end: int) -> dict[str, NDArray[Any]]:
        """Every column's rows ``[start, end)`` as views."""
        if self._pending:
            self._flush()
        if not 0 <= start <= end <= self._n:
            raise IndexError(f"slice [{start}, {end}) outside 0..{self._n}")
        return {name: arr[start:end] for name, arr in self._arrays.items()}

    def add_column(self, name: str, dtype: DTypeLike, shape: tuple[int, ...] = ()) -> None:
        """Create an extra column; rows that already exist are zero-filled."""
        if self._pending:
            self._flush()
        if name in self._arrays:
            raise ValueError(f"column {name!r} already exists")
        cap = max(self._arrays["ids"].shape[0], self._n)
        self._arrays[name] = np.zeros((cap, *shape), dtype=dtype)
        self._cap = 0
        self._views = None

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
        if self._pending:
            self._flush()
        if isinstance(ids, list | array) and extra is None and type(mask) is int \
                and (logprobs is None or isinstance(logprobs, list)) and self._views is not False:
            return self._append_small(ids, mask, logprobs)
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

    def _append_small(self, ids: list[int] | array[int], mask: int,
                      logprobs: list[float] | None) -> tuple[int, int]:
        # Python values written through the memoryviews: the same values numpy would store
        # (array's int and float casts are numpy's), with the same errors for ids that do
        # not fit int32 (OverflowError) or are not ints (TypeError).
        a = ids if type(ids) is array and ids.typecode == "i" else array("i", ids)
        n = len(a)
        start = self._n
        end = start + n
        if end > self._cap or self._views is None:
            self._reserve(end)
        views = self._views
        if not isinstance(views, tuple):  # formats numpy's buffers do not have here
            return self.append(np.asarray(a, dtype=np.int32), mask, logprobs)
        lps = _NAN_F * n if logprobs is None else array("f", logprobs)
        if len(lps) != n:
            raise ValueError(f"{len(lps)} logprobs for {n} ids")
        vi, vm, vl = views
        vi[start:end] = a
        vm[start:end] = bytes((mask,)) * n  # ValueError outside 0..255, as uint8 would
        vl[start:end] = lps
        self._n = end
        return start, end

    def extend(self, arrays: Mapping[str, NDArray[Any]]) -> tuple[int, int]:
        """Append rows given as named arrays (the form deltas carry) and return their slice.

        The arrays are kept by reference and copied in on the next read or append, so a run
        of extends costs one copy in total; they must not be modified afterwards (arrays
        decoded from frames are read-only).
        """
        rows = _rows(arrays)
        start = len(self)
        self._pending.append(arrays)
        self._pending_rows += rows
        return start, start + rows

    def _flush(self) -> None:
        chunks, self._pending = self._pending, []
        total = self._n + self._pending_rows
        self._pending_rows = 0
        if self._n == 0 and len(chunks) == 1 and not self.extra_names():
            # Empty columns and one chunk: adopt it (read-only views stay unchanged; the
            # next append reallocates because they are not writeable).
            adopted = Columns.from_arrays(chunks[0])
            self._arrays, self._n, self._cap = adopted._arrays, adopted._n, 0
            self._views = None
            return
        specs: dict[str, NDArray[Any]] = dict(self._arrays)
        for chunk in chunks:
            for name, arr in chunk.items():
                specs.setdefault(name, arr)
        new: dict[str, NDArray[Any]] = {}
        n = self._n
        for name, like in specs.items():
            out = np.empty((total, *like.shape[1:]), dtype=like.dtype)
            old = self._arrays.get(name)
            if old is not None:
                out[:n] = old[:n]
            else:
                out[:n] = 0
            pos = n
            for chunk in chunks:
                rows = int(chunk["ids"].shape[0])
                values = chunk.get(name)
                if values is not None:
                    out[pos : pos + rows] = values
                else:
                    out[pos : pos + rows] = np.nan if name == "logprobs" else 0
                pos += rows
            new[name] = out
        self._arrays, self._n, self._cap = new, total, total
        self._views = None

    def reserve(self, rows: int) -> None:
        """Make room for ``rows`` tokens in total, so appends up to there never reallocate.

        A capacity hint for writers that know their budget; contents are unchanged.
        """
        if self._pending:
            self._flush()
        if rows > self._cap:
            self._reserve(rows)

    def _reserve(self, need: int) -> None:
        arrays = self._arrays
        for name, arr in arrays.items():
            if arr.shape[0] < need or not arr.flags.writeable:
                arrays[name] = _grow(arr, self._n, need)
        self._cap = min(arr.shape[0] for arr in arrays.values())
        views = tuple(memoryview(arrays[name]) for name in BASE_COLUMNS)  # type: ignore[arg-type]
        self._views = (views if len(arrays) == len(BASE_COLUMNS) and tuple(
            v.format for v in views) == _VIEW_FORMATS else False)  # type: ignore[assignment]
