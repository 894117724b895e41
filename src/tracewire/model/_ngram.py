"""A tiny variable-order n-gram language model over token ids (numpy, no training at run time).

The shipped artifact is just the tokenized training stream; at load time the next-token
counts of every context of each order in :data:`ORDERS` are indexed by a 64-bit polynomial
hash. ``probs(context)`` interpolates from the unigram up to the longest context seen in
training, Witten-Bell style with a sharpness ``gamma``, plus a tiny uniform floor so every
token has a finite log-probability.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from io import BytesIO

import numpy as np
import numpy.typing as npt

from .._errors import ModelError

__all__ = ["ORDERS", "NgramModel", "load_model"]

ORDERS: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32)
_BASE = 0x9E3779B97F4A7C15
_MASK = (1 << 64) - 1
_F64 = npt.NDArray[np.float64]
_CACHE_ENTRIES = 4096  # x vocab x 8 bytes (about 20 MB at most)


@dataclass
class _Table:
    keys: npt.NDArray[np.uint64]  # sorted unique context hashes
    start: npt.NDArray[np.int64]  # pair range of each key: start[i]..start[i + 1]
    total: npt.NDArray[np.float64]  # occurrences of each context
    nxt: npt.NDArray[np.int64]  # next token of each (context, next) pair
    count: npt.NDArray[np.float64]  # its count


class NgramModel:
    """Interpolated variable-order n-gram; deterministic ``probs(context) -> float64[V]``."""

    def __init__(
        self, stream: npt.NDArray[np.integer], vocab_size: int, gamma: float, floor: float
    ) -> None:
        s = np.asarray(stream, dtype=np.int64)
        if s.size < 2 or int(s.min()) < 0 or int(s.max()) >= vocab_size:
            raise ModelError("model stream is empty or has ids outside the vocabulary")
        self.vocab_size = vocab_size
        self.gamma = gamma
        self.max_order = ORDERS[-1]
        uni = np.bincount(s, minlength=vocab_size).astype(np.float64)
        self.base: _F64 = (1.0 - floor) * uni / uni.sum() + floor / vocab_size
        self.tables: dict[int, _Table] = {}
        self._cache: dict[tuple[int, ...], _F64] = {}
        self._lock = threading.Lock()
        n = s.size
        h = np.zeros(n, dtype=np.uint64)
        s1 = (s + 1).astype(np.uint64)
        power = 1
        for k in range(1, self.max_order + 1):
            # h[j] = sum_{i<k} (s[j-i]+1) * B^i  (mod 2^64), valid for j >= k-1
            h[k - 1 :] += s1[: n - k + 1] * np.uint64(power)
            power = (power * _BASE) & _MASK
            if k in ORDERS and n - k > 0:
                self.tables[k] = self._index(h[k - 1 : n - 1], s[k:])

    @staticmethod
    def _index(keys: npt.NDArray[np.uint64], nxt: npt.NDArray[np.int64]) -> _Table:
        order = np.lexsort((nxt, keys))
        k, x = keys[order], nxt[order]
        new_pair = np.ones(k.size, dtype=bool)
        new_pair[1:] = (k[1:] != k[:-1]) | (x[1:] != x[:-1])
        pair_at = np.flatnonzero(new_pair)
        counts = np.diff(np.append(pair_at, k.size)).astype(np.float64)
        pk, px = k[pair_at], x[pair_at]
        new_key = np.ones(pk.size, dtype=bool)
        new_key[1:] = pk[1:] != pk[:-1]
        key_at = np.flatnonzero(new_key)
        totals = np.add.reduceat(counts, key_at)
        start = np.append(key_at, pk.size).astype(np.int64)
        return _Table(pk[key_at].copy(), start, totals, px.astype(np.int64), counts)

    def probs(self, context: Sequence[int]) -> _F64:
        """Next-token distribution after ``context`` (only its last 32 ids matter); read-only.

        Results are cached by context: RL asks for many samples of the same prompt.
        """
        key_ctx = tuple(int(t) for t in context[-self.max_order :])
        hit = self._cache.get(key_ctx)
        if hit is not None:
            return hit
        p = self._compute(key_ctx)
        p.flags.writeable = False
        with self._lock:  # servers on several threads may share this model
            if len(self._cache) >= _CACHE_ENTRIES:
                self._cache.pop(next(iter(self._cache)))  # drop the oldest entry
            self._cache[key_ctx] = p
        return p

    def _compute(self, context: Sequence[int]) -> _F64:
        p = self.base.copy()
        h = 0
        power = 1
        n = len(context)
        for k in range(1, min(n, self.max_order) + 1):
            h = (h + (int(context[n - k]) + 1) * power) & _MASK
            power = (power * _BASE) & _MASK
            table = self.tables.get(k)
            if table is None:
                continue
            key = np.uint64(h)
            i = int(np.searchsorted(table.keys, key))
            if i >= table.keys.size or table.keys[i] != key:
                break  # longer contexts cannot occur either
            a, b = int(table.start[i]), int(table.start[i + 1])
            total = float(table.total[i])
            back = self.gamma * (b - a)
            denom = total + back
            p *= back / denom
            p[table.nxt[a:b]] += table.count[a:b] / denom
        return p


_MODEL: list[NgramModel] = []


def load_model(vocab_size: int) -> NgramModel:
    """The model shipped in the package (built once per process)."""
    if not _MODEL:
        raw = resources.files("tracewire.model").joinpath("assets/model.npz").read_bytes()
        with np.load(BytesIO(raw)) as z:
            stream = z["stream"]
            gamma = float(z["gamma"])
            floor = float(z["floor"])
        _MODEL.append(NgramModel(stream, vocab_size, gamma, floor))
    return _MODEL[0]
