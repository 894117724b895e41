"""Codecs: binary frames and records (header + raw column buffers), JSON, and deltas.

One API shape for every format: ``encode_*`` / ``decode_*``. Decoding anything malformed
raises :class:`tracewire.DecodeError` (a ``ValueError``) with a message saying what is wrong.
"""

from ._arrays import Buffer
from ._binary import (
    RECORD_MAGIC,
    RECORD_PREFIX,
    Decoded,
    RecordInfo,
    decode_frames,
    decode_record,
    encode_frames,
    encode_record,
    encoded_size,
    frames_to_record,
    record_info,
    record_length,
    verify_record,
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
from ._summary import CallSummary, EpisodeSummary, SpanSummary, TraceSummary, decode_summary

__all__ = [
    "RECORD_MAGIC",
    "RECORD_PREFIX",
    "Buffer",
    "CallSummary",
    "Cursor",
    "Decoded",
    "EpisodeAssembler",
    "EpisodeDelta",
    "EpisodeHead",
    "EpisodeHeader",
    "EpisodeSender",
    "EpisodeSummary",
    "RecordInfo",
    "SpanSummary",
    "TraceDelta",
    "TraceHeader",
    "TraceSender",
    "TraceSummary",
    "cursor_of",
    "decode_frames",
    "decode_json",
    "decode_record",
    "decode_summary",
    "encode_frames",
    "encode_json",
    "encode_record",
    "encoded_size",
    "frames_to_record",
    "record_bytes",
    "record_info",
    "record_length",
    "to_builtins",
    "verify_record",
]


def record_bytes(obj: "Episode | Trace | EpisodeDelta") -> bytes:
    """Encode to one contiguous record (joins :func:`encode_record`'s parts)."""
    return b"".join(encode_record(obj))


from ..trace import Episode, Trace  # noqa: E402  (for the annotation above)
