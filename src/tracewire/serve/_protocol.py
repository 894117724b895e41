"""Wire protocol of the env server: a small msgpack envelope in front of tracewire frames.

Every message between client and broker is ``[envelope, *tracewire_frames]`` where the
envelope is the msgpack array ``[proto, schema, kind, rid, body]``:

- ``proto``: :data:`PROTOCOL_VERSION`; ``schema``: the trace schema version of the sender;
- ``kind``: requests ``hello | run | run_group | cancel | health | stats | hb`` (``hb``:
  a waiting client's sign of life, never answered, see ``_liveness``); answers
  ``delta | reply | error``;
- ``rid``: the client's request id (a string), echoed on every answer;
- ``body``: a small msgpack map (task, group index, cursors, error type and message ...).

Token data never goes in the envelope: deltas and episodes follow as the frames of
:func:`tracewire.codec.encode_frames`. Between broker and worker a message is prefixed by one
more frame, the *job frame* (``<QB``: job id, :class:`JobKind`), so the broker routes worker
output to clients by reading 9 bytes and forwards the rest without decoding it. When the
client and server share a host, a run's deltas and reply skip the broker (``_direct``).
"""

from __future__ import annotations

import struct
from enum import IntEnum, StrEnum
from typing import Any

import msgspec

from .._errors import (
    BusyError,
    DecodeError,
    DeltaError,
    EnvError,
    ProtocolError,
    RunTimeout,
    SchemaVersionError,
    ServeError,
    TracewireError,
    WorkerDiedError,
)
from .._wire_errors import error_body
from .._wire_errors import error_from_body as _wire_error_from_body
from ..codec import Cursor, cursor_of
from ..trace import SCHEMA_VERSION, Trace

__all__ = [
    "ANSWERS",
    "PROTOCOL_VERSION",
    "REQUESTS",
    "Envelope",
    "JobKind",
    "Kind",
    "cursor_list",
    "decode_envelope",
    "encode_envelope",
    "error_body",
    "error_from_body",
    "job_frame",
    "parse_job_frame",
]

#: Version of the envelope protocol; a peer speaking another one is refused with a clear error.
#: 2: direct-path messages start with the client's token frame (``data_key``).
PROTOCOL_VERSION = 2


class Kind(StrEnum):
    """An envelope's ``kind`` (the string on the wire): client requests, their answers, and
    the broker/worker control messages."""

    HELLO = "hello"
    RUN = "run"
    RUN_GROUP = "run_group"
    CANCEL = "cancel"
    HEALTH = "health"
    STATS = "stats"
    #: From a waiting client: a sign of life (never answered); from a worker: its load.
    HB = "hb"
    DELTA = "delta"
    REPLY = "reply"
    ERROR = "error"
    #: Broker to worker: is the connection still there?
    PROBE = "probe"
    #: Worker to broker: a job finished (after its reply), started, failed to start, and
    #: broker to worker: stop.
    DONE = "done"
    READY = "ready"
    FATAL = "fatal"
    STOP = "stop"


REQUESTS = frozenset({Kind.HELLO, Kind.RUN, Kind.RUN_GROUP, Kind.CANCEL, Kind.HEALTH,
                      Kind.STATS, Kind.HB})
ANSWERS = frozenset({Kind.DELTA, Kind.REPLY, Kind.ERROR})
#: Upper bound on an envelope (the task rides in it); token data travels in other frames.
MAX_ENVELOPE_BYTES = 4 << 20

_JOB = struct.Struct("<QB")
_enc = msgspec.msgpack.Encoder()
_dec = msgspec.msgpack.Decoder()


class JobKind(IntEnum):
    """What a worker message carries for its job (the second field of the job frame)."""

    DELTA = 0
    REPLY = 1
    ERROR = 2
    #: The worker stopped a cancelled job; frees its slot, never forwarded to a client.
    CANCELLED = 3
    #: The worker sent the final reply straight to the client (see ``_direct``); no payload.
    DONE = 4


class Envelope(msgspec.Struct, frozen=True):
    """A decoded envelope."""

    proto: int
    schema: int
    kind: str
    rid: str
    body: dict[str, Any]


def encode_envelope(kind: str, rid: str, body: dict[str, Any] | None = None, *,
                    proto: int = PROTOCOL_VERSION, schema: int = SCHEMA_VERSION) -> bytes:
    """Encode one envelope frame."""
    return _enc.encode([proto, schema, kind, rid, body or {}])


def decode_envelope(frame: Any, *, check_version: bool = True) -> Envelope:
    """Decode and check an envelope frame; raises :class:`ProtocolError` naming the problem.

    With ``check_version`` a peer speaking another protocol or schema version is refused; the
    error then carries the request id in ``rid`` (when readable) so it can be answered.
    """
    mv = memoryview(frame)
    if mv.nbytes > MAX_ENVELOPE_BYTES:
        raise ProtocolError(f"envelope of {mv.nbytes} bytes is over {MAX_ENVELOPE_BYTES}")
    try:
        raw = _dec.decode(mv)
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"malformed envelope: {exc}") from exc
    if not (isinstance(raw, list) and len(raw) == 5):
        raise ProtocolError("malformed envelope: expected [proto, schema, kind, rid, body]")
    proto, schema, kind, rid, body = raw
    if not (isinstance(proto, int) and isinstance(schema, int) and isinstance(kind, str)
            and isinstance(rid, str) and isinstance(body, dict)):
        raise ProtocolError("malformed envelope: fields have the wrong types")
    if check_version and (proto != PROTOCOL_VERSION or schema != SCHEMA_VERSION):
        err = ProtocolError(
            f"version mismatch: peer speaks protocol {proto} / schema {schema}, this side "
            f"speaks protocol {PROTOCOL_VERSION} / schema {SCHEMA_VERSION}; upgrade the "
            "older side"
        )
        err.rid = rid  # type: ignore[attr-defined]
        raise err
    return Envelope(proto, schema, kind, rid, body)


def job_frame(job: int, kind: JobKind) -> bytes:
    """The routing frame a worker puts in front of its output for ``job``."""
    return _JOB.pack(job, kind)


def parse_job_frame(frame: Any) -> tuple[int, JobKind]:
    """Read a job frame; raises :class:`ProtocolError` if it is not one."""
    mv = memoryview(frame)
    if mv.nbytes != _JOB.size:
        raise ProtocolError(f"job frame of {mv.nbytes} bytes, expected {_JOB.size}")
    job, kind = _JOB.unpack(mv)
    try:
        return job, JobKind(kind)
    except ValueError as exc:
        raise ProtocolError(f"unknown job kind {kind}") from exc


_KNOWN = (BusyError, WorkerDiedError, RunTimeout, ProtocolError, ServeError, EnvError,
          DecodeError, DeltaError, SchemaVersionError)


def error_from_body(body: dict[str, Any], where: str = "") -> TracewireError:
    """Rebuild the error an ``error`` answer describes (``ServeError`` for other types)."""
    return _wire_error_from_body(body, where, ServeError, _KNOWN)


def cursor_list(trace: Trace) -> list[int]:
    """A trace's cursor as the plain list the final reply carries."""
    c: Cursor = cursor_of(trace)
    return [c.nodes, c.tokens, c.calls, c.errors]
