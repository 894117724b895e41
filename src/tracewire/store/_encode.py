"""Episode -> record parts in the writer thread, in slices that let the event loop run.

``tracewire.codec.encode_record(episode, pause=...)`` encodes long node/call lists a chunk
per C call and computes the CRCs over 1 MiB slices, calling ``pause`` between them; the
bytes are exactly those of ``encode_record(episode)`` (tests check that). This module
supplies the pause.

A pause is ``os.sched_yield()``: it drops the GIL *and* the CPU. Dropping the GIL alone is
not enough on a busy machine: when the loop thread shares a CPU with this thread, the
scheduler lets this thread run on until the next timer tick (4 ms at HZ=250) unless it
yields, and the crc32c and write calls release the GIL but not the CPU.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence

from ..codec import Buffer, encode_record, frames_to_record
from ..trace import Episode

__all__ = ["episode_parts", "record_parts", "yield_gil"]


#: Longest the writer thread works between two naps (seconds), and the nap itself.
NAP_EVERY = 0.0005
NAP = 50e-6
_last_nap = [0.0]


def yield_gil() -> None:
    """Give the event-loop thread a chance to take the GIL and the CPU.

    Usually ``os.sched_yield()`` (drops both, costs ~1 µs). But a thread that drops the GIL
    and asks for it again at once mostly wins the race against a waiter woken on another
    CPU, and each such hand-back also resets CPython's switch-interval timeout of the
    waiter; so after ``NAP_EVERY`` seconds of work it naps ``NAP`` seconds instead, long
    enough for a waiting loop thread to get the GIL.
    """
    now = time.perf_counter()
    if now - _last_nap[0] >= NAP_EVERY:
        time.sleep(NAP)
        _last_nap[0] = time.perf_counter()
    else:
        os.sched_yield()


def episode_parts(e: Episode, pause: Callable[[], None] = yield_gil) -> list[Buffer]:
    """Record parts of ``e`` (write them with ``os.writev``); column memory is shared."""
    return encode_record(e, pause=pause)


def record_parts(frames: Sequence[Buffer], pause: Callable[[], None] = yield_gil) -> list[Buffer]:
    """Parts of one record built from ``frames`` (``encode_frames`` output) without decoding
    the header, with pauses during the CRCs."""
    return frames_to_record(frames, pause=pause)
