"""Running a function inline or in a worker thread, by the size of what it works on.

A carrier, not a step: the turn pipeline and the upstreams hand it a step's function, and it
runs that function on the loop when the input is small or in a thread when it is big (so a
big body never stalls the loop, and a small one skips the thread hop's cost).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["offload"]

T = TypeVar("T")


async def offload(size: int, threshold: int, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, in a worker thread when ``size`` (bytes) is over ``threshold``, so big
    bodies never stall the event loop; small ones skip the thread hop's cost."""
    if size > threshold:
        return await asyncio.to_thread(fn, *args)
    return fn(*args)
