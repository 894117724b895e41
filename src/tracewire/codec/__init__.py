"""Codecs: binary frames and records (header + raw column buffers), JSON, and deltas.

One API shape for every format: ``encode_*`` / ``decode_*``. Decoding anything malformed
raises :class:`tracewire.DecodeError` (a ``ValueError``) with a message saying what is wrong.
"""

from ._arrays import Buffer
from ._binary import (
    RECORD_PREFIX,
    Decoded,
    decode_frames,
    decode_record,
    encode_frames,
    encode_record,
    encoded_size,
    frames_to_record,
    record_length,
)
from ._delta import (
    Cursor,
    EpisodeAssembler,
    EpisodeDelta,
    EpisodeHead,
    EpisodeSender,
    TraceDelta,
    TraceSender,
    cursor_of,
)
from ._headers import EpisodeHeader, TraceHeader
from ._json import decode_json, encode_json, to_builtins

__all__ = [
    "RECORD_PREFIX",
    "Buffer",
    "Cursor",
    "Decoded",
    "EpisodeAssembler",
    "EpisodeDelta",
    "EpisodeHead",
    "EpisodeHeader",
    "EpisodeSender",
    "TraceDelta",
    "TraceHeader",
    "TraceSender",
    "cursor_of",
    "decode_frames",
    "decode_json",
    "decode_record",
    "encode_frames",
    "encode_json",
    "encode_record",
    "encoded_size",
    "frames_to_record",
    "record_bytes",
    "record_length",
    "to_builtins",
]


def record_bytes(obj: "Episode | Trace | EpisodeDelta") -> bytes:
    """Encode to one contiguous record (joins :func:`encode_record`'s parts)."""
    return b"".join(encode_record(obj))


from ..trace import Episode, Trace  # noqa: E402  (for the annotation above)
