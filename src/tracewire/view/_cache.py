"""A small thread-safe LRU used for decoded episodes and branch columns."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Generic, TypeVar

__all__ = ["LRU"]

K = TypeVar("K")
V = TypeVar("V")


class LRU(Generic[K, V]):
    """Least-recently-used map holding at most ``size`` entries (guarded by a lock, since
    worker threads fill it)."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._data: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        """The value under ``key`` (marking it recently used), or None."""
        with self._lock:
            v = self._data.get(key)
            if v is not None:
                self._data.move_to_end(key)
            return v

    def put(self, key: K, value: V) -> None:
        """Store ``value``, evicting the least recently used entry when full."""
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self._size:
                self._data.popitem(last=False)

    def clear(self) -> None:
        """Drop every entry."""
        with self._lock:
            self._data.clear()
