"""Episode -> record parts, in GIL-friendly slices (runs in the writer thread).

``encode_record(episode)`` encodes all nodes and calls of a trace in one C call that holds
the GIL; for a 10,000-turn episode that is ~20 ms during which the event loop cannot run.
Here long node/call lists are pre-encoded in chunks, with a GIL release between chunks, and
spliced into the header as ``msgspec.Raw``; the result is byte-for-byte what
``tracewire.codec.encode_record`` produces (a test checks that).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import numpy as np

from ..codec import EpisodeHeader, TraceHeader, encode_frames, frames_to_record
from ..trace import Episode, Trace

__all__ = ["CHUNK", "episode_parts", "yield_gil"]

#: Items encoded per C call; ~0.3 ms for typical nodes.
CHUNK = 256
Buffer = bytes | bytearray | memoryview


def _hook(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


_enc = msgspec.msgpack.Encoder(enc_hook=_hook)


def yield_gil() -> None:
    """Give the event-loop thread a chance to take the GIL."""
    os.sched_yield()


def _array_head(n: int) -> bytes:
    if n < 16:
        return bytes([0x90 | n])
    if n < 1 << 16:
        return b"\xdc" + struct.pack(">H", n)
    return b"\xdd" + struct.pack(">I", n)


def _head_len(first: int) -> int:
    if first & 0xF0 == 0x90:
        return 1
    return 3 if first == 0xDC else 5


def _packed(items: Sequence[Any], pause: Callable[[], None]) -> Any:
    """``items`` itself when short, else a ``msgspec.Raw`` of its msgpack array."""
    n = len(items)
    if n <= CHUNK:
        return items
    out = bytearray(_array_head(n))
    for i in range(0, n, CHUNK):
        b = _enc.encode(items[i : i + CHUNK])
        out += memoryview(b)[_head_len(b[0]) :]
        pause()
    return msgspec.Raw(out)


def _trace(t: Trace, pause: Callable[[], None]) -> TraceHeader:
    return TraceHeader(
        id=t.id,
        schema=t.schema,
        agent=t.agent,
        nodes=_packed(t.nodes, pause),
        calls=_packed(t.calls, pause),
        errors=_packed(t.errors, pause),
        timing=t.timing,
        rewards=t.rewards,
        metrics=t.metrics,
        info=t.info,
        stop=t.stop,
        completed=t.completed,
        ok=t.ok,
        columns=t.tokens.arrays(),
    )


def episode_parts(e: Episode, pause: Callable[[], None] = yield_gil) -> list[Buffer]:
    """Record parts of ``e`` (write them with ``os.writev``); column memory is shared."""
    header = EpisodeHeader(
        id=e.id,
        env=e.env,
        task_key=e.task_key,
        task=e.task,
        group_id=e.group_id,
        group_index=e.group_index,
        run=e.run,
        ok=e.ok,
        errors=e.errors,
        timing=e.timing,
        info=e.info,
        traces=[_trace(t, pause) for t in e.traces],
    )
    frames = encode_frames(header)
    pause()
    return frames_to_record(frames)
