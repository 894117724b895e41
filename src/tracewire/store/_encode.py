"""Episode -> record parts, in slices that let the event loop run (writer thread).

``encode_record(episode)`` encodes all nodes and calls of a trace in one C call that holds
the GIL; for a 10,000-turn episode that is ~20 ms during which the event loop cannot run.
Here long node/call lists are pre-encoded in chunks, with a pause between chunks, and
spliced into the header as ``msgspec.Raw``; the CRCs are computed over slices of at most
``CRC_SLICE`` bytes with a pause between them. The result is byte-for-byte what
``tracewire.codec.encode_record`` produces (tests check that).

A pause is ``os.sched_yield()``: it drops the GIL *and* the CPU. Dropping the GIL alone is
not enough on a busy machine: when the loop thread shares a CPU with this thread, the
scheduler lets this thread run on until the next timer tick (4 ms at HZ=250) unless it
yields, and the crc32c and write calls release the GIL but not the CPU.
"""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Callable, Sequence
from typing import Any

import crc32c
import msgspec
import numpy as np

from .._errors import DecodeError
from ..codec import EpisodeHeader, TraceHeader, encode_frames
from ..trace import Episode, Trace

__all__ = ["CHUNK", "CRC_SLICE", "episode_parts", "record_parts", "yield_gil"]

#: Items encoded per C call; ~0.3 ms for typical nodes.
CHUNK = 256
#: Bytes per crc32c call (~0.1 ms).
CRC_SLICE = 1 << 20
Buffer = bytes | bytearray | memoryview


def _hook(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


_enc = msgspec.msgpack.Encoder(enc_hook=_hook)


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
    return record_parts(frames, pause)


# Record framing (see ``tracewire.codec._binary``): 32-byte prefix, buffer table, header,
# 8-byte aligned buffers. Same bytes as ``codec.frames_to_record``, CRCs computed in slices.
_FIXED = struct.Struct("<4sHHIIQ")
_ENTRY = struct.Struct("<QQ")
_PAD = bytes(8)
_PREFIX_LEN = 32


def _crc(buf: Buffer, value: int, pause: Callable[[], None]) -> int:
    mv = memoryview(buf).cast("B")
    n = mv.nbytes
    if n <= CRC_SLICE:
        return int(crc32c.crc32c(mv, value))
    for i in range(0, n, CRC_SLICE):
        value = crc32c.crc32c(mv[i : i + CRC_SLICE], value)
        pause()
    return int(value)


def record_parts(frames: Sequence[Buffer], pause: Callable[[], None] = yield_gil) -> list[Buffer]:
    """Parts of one record built from ``frames`` (``encode_frames`` output) without decoding
    the header: what ``codec.frames_to_record`` returns, with pauses during the CRCs."""
    if not frames:
        raise DecodeError("no frames")
    first = memoryview(frames[0]).cast("B")
    if first.nbytes < 4 or bytes(first[:2]) != b"TW":
        raise DecodeError("not a tracewire frame")
    (version,) = struct.unpack_from("<H", first, 2)
    header = first[4:]
    bufs = [memoryview(b).cast("B") for b in frames[1:]]
    pos = _PREFIX_LEN + _ENTRY.size * len(bufs) + header.nbytes
    head_pad = -pos & 7
    pos += head_pad
    entries = bytearray()
    body: list[Buffer] = [_PAD[:head_pad]] if head_pad else []
    bcrc = crc32c.crc32c(body[0]) if body else 0
    for b in bufs:
        entries += _ENTRY.pack(pos, b.nbytes)
        body.append(b)
        bcrc = _crc(b, bcrc, pause)
        pad = -b.nbytes & 7
        if pad:
            body.append(_PAD[:pad])
            bcrc = crc32c.crc32c(_PAD[:pad], bcrc)
        pos += b.nbytes + pad
    fixed = _FIXED.pack(b"TWR1", version, 0, header.nbytes, len(bufs), pos)
    hcrc = _crc(header, crc32c.crc32c(bytes(entries), crc32c.crc32c(fixed)), pause)
    prefix = fixed + struct.pack("<II", hcrc, bcrc)
    return [prefix, bytes(entries), header, *body]
