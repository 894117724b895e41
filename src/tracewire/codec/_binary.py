"""Binary codec: a small msgpack header plus raw column buffers, in two framings.

*Frames* (for ZMQ multipart): ``[b"TW" + u16 schema + header, buf0, buf1, ...]``; encoding
shares the columns' memory and decoding wraps the received buffers with ``np.frombuffer``,
so neither copies token data.

*Record* (for disk): one contiguous byte string, self-checking::

    0   magic      4s   b"TWR1"
    4   schema     u16  schema version of the header
    6   flags      u16  reserved, 0
    8   hlen       u32  header length
    12  nbuf       u32  number of buffers
    16  total      u64  length of the whole record
    24  hcrc       u32  CRC32C of bytes 0..24, the buffer table and the header
    28  bcrc       u32  CRC32C of everything after the header (buffers and padding)
    32  table      nbuf x (u64 offset from record start, u64 nbytes)
    ..  header     hlen bytes of msgpack
    ..  buffers    each starting at an 8-byte aligned offset

A record is built from frames without decoding the header (``frames_to_record``), so bytes
received over the wire are persisted as they are.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import crc32c
import msgspec

from .._errors import DecodeError, SchemaVersionError
from ..trace import SCHEMA_VERSION, Episode, Trace
from ._arrays import Buffer, arrays_state, dec_hook, enc_hook
from ._delta import EpisodeDelta
from ._headers import (
    EpisodeHeader,
    Pack,
    TraceHeader,
    episode_from_header,
    episode_header,
    trace_from_header,
    trace_header,
)

__all__ = [
    "CHUNK",
    "CRC_SLICE",
    "RECORD_MAGIC",
    "RECORD_PREFIX",
    "Decoded",
    "Pause",
    "RecordInfo",
    "decode_frames",
    "decode_record",
    "encode_frames",
    "encode_record",
    "encoded_size",
    "frames_to_record",
    "record_info",
    "record_length",
    "verify_record",
]

#: What the binary codec decodes to.
Decoded = Episode | Trace | EpisodeDelta
Encodable = Episode | Trace | EpisodeDelta | EpisodeHeader | TraceHeader

_FRAME_PREFIX = struct.Struct("<2sH")
_RECORD = struct.Struct("<4sHHIIQII")
#: Size of the fixed record prefix, enough to learn a record's total length.
RECORD_PREFIX = _RECORD.size
_ENTRY = struct.Struct("<QQ")
#: The first four bytes of every record (a scan for damaged data looks for the next one).
RECORD_MAGIC = b"TWR1"
_MAGIC = RECORD_MAGIC
_MAX_BUFFERS = 1 << 16
_PAD = bytes(8)

_encoder = msgspec.msgpack.Encoder(enc_hook=enc_hook)
_decoder = msgspec.msgpack.Decoder(EpisodeHeader | TraceHeader | EpisodeDelta, dec_hook=dec_hook)


#: Called between slices of long work so another thread (the event loop) can run.
Pause = Callable[[], None]
#: Items per msgpack call when encoding long lists with pauses (~0.3 ms for typical nodes).
CHUNK = 256
#: Bytes per CRC call when computing CRCs with pauses (~0.1 ms).
CRC_SLICE = 1 << 20


def _header_of(obj: Encodable, pack: Pack | None) -> EpisodeHeader | TraceHeader | EpisodeDelta:
    if isinstance(obj, Episode):
        return episode_header(obj) if pack is None else episode_header(obj, pack)
    if isinstance(obj, Trace):
        return trace_header(obj) if pack is None else trace_header(obj, pack)
    return obj


def encode_frames(obj: Encodable, *, pause: Pause | None = None) -> list[Buffer]:
    """Encode to ZMQ-style frames; column memory is shared, not copied.

    With ``pause``, long node/call lists are encoded ``CHUNK`` items per C call with a
    ``pause()`` between calls (same bytes), so a writer thread never holds the GIL long.
    """
    state = arrays_state
    state.out = []
    try:
        sized = [0]
        header = _header_of(obj, None if pause is None else _chunked(pause, sized))
        # Encode straight after the 4-byte prefix, into a buffer already big enough for the
        # pre-encoded lists: no second copy of a multi-MB header, no regrowth copies.
        first = bytearray(_FRAME_PREFIX.size + sized[0] + 4096)
        first[: _FRAME_PREFIX.size] = _FRAME_PREFIX.pack(b"TW", SCHEMA_VERSION)
        _encoder.encode_into(header, first, _FRAME_PREFIX.size)
        return [first, *state.out]
    finally:
        state.out = []


def _array_head(n: int) -> bytes:
    if n < 16:
        return bytes([0x90 | n])
    return b"\xdc" + struct.pack(">H", n) if n < 1 << 16 else b"\xdd" + struct.pack(">I", n)


def _chunked(pause: Pause, sized: list[int]) -> Pack:
    def pack(items: list[Any]) -> Any:
        n = len(items)
        if n <= CHUNK:
            return items
        # A msgpack array is its length header followed by its items: encode the items in
        # slices, strip each slice's own header, splice them under one header as Raw.
        out = bytearray(_array_head(n))
        for i in range(0, n, CHUNK):
            b = _encoder.encode(items[i : i + CHUNK])
            out += memoryview(b)[1 if b[0] & 0xF0 == 0x90 else 3 if b[0] == 0xDC else 5 :]
            pause()
        sized[0] += len(out)
        return msgspec.Raw(out)

    return pack


def _crc(buf: Buffer, value: int, pause: Pause | None) -> int:
    mv = memoryview(buf).cast("B")
    if pause is None or mv.nbytes <= CRC_SLICE:
        return int(crc32c.crc32c(mv, value))
    for i in range(0, mv.nbytes, CRC_SLICE):
        value = crc32c.crc32c(mv[i : i + CRC_SLICE], value)
        pause()
    return int(value)


def _check_schema(version: int) -> None:
    if not 1 <= version <= SCHEMA_VERSION:
        raise SchemaVersionError(
            f"data has schema version {version}; this build reads 1..{SCHEMA_VERSION}"
        )


def _decode_header(header: Buffer, bufs: Sequence[Buffer]) -> Decoded:
    state = arrays_state
    state.inp, state.used = bufs, 0
    try:
        obj: EpisodeHeader | TraceHeader | EpisodeDelta = _decoder.decode(header)
        if state.used != len(bufs):
            raise DecodeError(f"{len(bufs)} buffers given, header references {state.used}")
        if isinstance(obj, EpisodeHeader):
            return episode_from_header(obj)
        if isinstance(obj, TraceHeader):
            return trace_from_header(obj)
        return obj
    except msgspec.DecodeError as exc:
        raise DecodeError(f"malformed header: {exc}") from exc
    except (ValueError, TypeError, IndexError, OverflowError) as exc:
        if isinstance(exc, DecodeError):
            raise
        raise DecodeError(f"invalid content: {exc}") from exc
    finally:
        state.inp, state.used = (), 0


def decode_frames(frames: Sequence[Buffer]) -> Decoded:
    """Decode frames from :func:`encode_frames`; raises ``DecodeError`` on anything bad."""
    if not frames:
        raise DecodeError("no frames")
    first = memoryview(frames[0])
    if first.nbytes < _FRAME_PREFIX.size:
        raise DecodeError("first frame too short for a tracewire header")
    magic, version = _FRAME_PREFIX.unpack_from(first)
    if magic != b"TW":
        raise DecodeError(f"not a tracewire frame (magic {bytes(magic)!r})")
    _check_schema(version)
    return _decode_header(first[_FRAME_PREFIX.size :], frames[1:])


def _align(n: int) -> int:
    return (n + 7) & ~7


def frames_to_record(frames: Sequence[Buffer], *, pause: Pause | None = None) -> list[Buffer]:
    """Turn frames into the parts of one record (join them, or ``writev`` them) without
    decoding the header. Computes the CRCs (one pass over the bytes; in ``CRC_SLICE``
    slices with ``pause()`` between them when given)."""
    if not frames:
        raise DecodeError("no frames")
    first = memoryview(frames[0])
    if first.nbytes < _FRAME_PREFIX.size or bytes(first[:2]) != b"TW":
        raise DecodeError("not a tracewire frame")
    (_, version) = _FRAME_PREFIX.unpack_from(first)
    header = first[_FRAME_PREFIX.size :]
    bufs = [memoryview(b) for b in frames[1:]]
    table_len = _ENTRY.size * len(bufs)
    pos = _align(RECORD_PREFIX + table_len + header.nbytes)
    head_pad = pos - (RECORD_PREFIX + table_len + header.nbytes)
    entries = bytearray()
    body: list[Buffer] = [_PAD[:head_pad]] if head_pad else []
    bcrc = crc32c.crc32c(body[0]) if body else 0
    for b in bufs:
        entries += _ENTRY.pack(pos, b.nbytes)
        body.append(b)
        bcrc = _crc(b, bcrc, pause)
        pad = _align(b.nbytes) - b.nbytes
        if pad:
            body.append(_PAD[:pad])
            bcrc = crc32c.crc32c(_PAD[:pad], bcrc)
        pos += _align(b.nbytes)
    fixed = _RECORD.pack(_MAGIC, version, 0, header.nbytes, len(bufs), pos, 0, 0)[:24]
    hcrc = _crc(header, crc32c.crc32c(bytes(entries), crc32c.crc32c(fixed)), pause)
    prefix = fixed + struct.pack("<II", hcrc, bcrc)
    return [prefix, bytes(entries), header, *body]


def encode_record(obj: Encodable, *, pause: Pause | None = None) -> list[Buffer]:
    """Encode to the parts of one record: write them in order (``os.writev``) or join them.

    ``pause`` slices the work as in :func:`encode_frames` and :func:`frames_to_record`.
    """
    return frames_to_record(encode_frames(obj, pause=pause), pause=pause)


class RecordInfo(NamedTuple):
    """What a record's fixed prefix says: its length, where its msgpack header lies, the
    header's CRC (the store keeps it in the index to tell records apart) and its schema."""

    total: int
    header_offset: int
    header_len: int
    header_crc: int
    schema: int
    nbuf: int


def record_info(prefix: Buffer) -> RecordInfo:
    """Parse the first ``RECORD_PREFIX`` bytes of a record (magic and sizes checked)."""
    mv = memoryview(prefix)
    if mv.nbytes < RECORD_PREFIX:
        raise DecodeError(f"record prefix needs {RECORD_PREFIX} bytes, got {mv.nbytes}")
    magic, version, _, hlen, nbuf, total, hcrc, _ = _RECORD.unpack_from(mv)
    if magic != _MAGIC:
        raise DecodeError(f"not a tracewire record (magic {bytes(magic)!r})")
    if nbuf > _MAX_BUFFERS or total < RECORD_PREFIX + nbuf * _ENTRY.size + hlen:
        raise DecodeError("record prefix is inconsistent")
    hoff = RECORD_PREFIX + nbuf * _ENTRY.size
    return RecordInfo(int(total), hoff, int(hlen), int(hcrc), int(version), int(nbuf))


def record_length(prefix: Buffer) -> int:
    """Total length of the record whose first ``RECORD_PREFIX`` bytes are ``prefix``."""
    return record_info(prefix).total


def verify_record(data: Buffer) -> RecordInfo:
    """Check a record's framing and both CRCs without decoding its header.

    Passing means the bytes are exactly what a writer wrote: a record that then fails to
    decode (a newer schema, a buggy writer) is intact data, never a torn tail to cut off.
    Raises ``DecodeError`` for truncated, inconsistent or CRC-failing bytes.
    """
    mv = memoryview(data)
    info = record_info(mv)
    total, table_end, hlen = info.total, info.header_offset, info.header_len
    if mv.nbytes < total:
        raise DecodeError(f"record truncated: {mv.nbytes} of {total} bytes")
    got = crc32c.crc32c(
        mv[table_end : table_end + hlen],
        crc32c.crc32c(mv[RECORD_PREFIX:table_end], crc32c.crc32c(mv[:24])),
    )
    if got != info.header_crc:
        raise DecodeError("record header fails its CRC")
    (bcrc,) = struct.unpack_from("<I", mv, 28)
    if crc32c.crc32c(mv[table_end + hlen : total]) != bcrc:
        raise DecodeError("record buffers fail their CRC")
    return info


def decode_record(data: Buffer, *, verify: bool = True) -> Decoded:
    """Decode one record (bytes, memoryview or mmap slice) without copying its buffers.

    With ``verify`` both CRCs are checked. Anything malformed raises ``DecodeError``.
    """
    mv = memoryview(data)
    info = verify_record(mv) if verify else record_info(mv)
    total, table_end, hlen = info.total, info.header_offset, info.header_len
    if mv.nbytes < total:
        raise DecodeError(f"record truncated: {mv.nbytes} of {total} bytes")
    _check_schema(info.schema)
    bufs: list[Buffer] = []
    lo = table_end + hlen
    for i in range(info.nbuf):
        off, n = _ENTRY.unpack_from(mv, RECORD_PREFIX + i * _ENTRY.size)
        if off < lo or off + n > total:
            raise DecodeError(f"buffer {i} lies outside the record")
        bufs.append(mv[off : off + n])
    return _decode_header(mv[table_end : table_end + hlen], bufs)


def encoded_size(parts: Sequence[Buffer]) -> int:
    """Total bytes of a list of frames or record parts."""
    return sum(memoryview(p).nbytes for p in parts)
