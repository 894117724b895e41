"""The one error tree of tracewire.

Every error raised on purpose by tracewire derives from :class:`TracewireError` and also from
the built-in exception it stands in for, so ``except ValueError`` keeps working::

    TracewireError (Exception)
    ├── DecodeError (ValueError)            malformed, truncated, version- or CRC-failing bytes
    │   └── DeltaError                      a delta that does not apply (lost, reordered, unknown)
    ├── SchemaVersionError (DecodeError)    bytes written by another schema version
    ├── LimitError (ValueError)             input over a configured bound (size, turns, sessions)
    ├── PlanError (ValueError)              an eval's options are out of range or conflict
    │   └── PlanTypeError (TypeError)       an eval option of the wrong type, or unknown
    ├── StoreError (OSError)                run directory cannot be written or read
    │   └── CorruptRecordError              a record on disk fails its CRC or framing
    ├── ModelError (RuntimeError)           built-in model: bad request or generation failure
    ├── ProxyError (RuntimeError)           proxy/session server failure
    │   ├── UpstreamError                   the upstream model server failed or answered badly
    │   │   └── UpstreamShapeError *        token-in reply unusable (logprobs ≠ completion)
    │   ├── UpstreamConfigError (ValueError) the upstream's URL or headers cannot be used
    │   ├── TemplateError (ValueError) ***  tokenizer dir or chat template unusable
    │   ├── BridgeError (ValueError) *      new messages do not extend the recorded ids
    │   └── TruncatedTurnError (ValueError) * extending a length-cut turn under "refuse"
    ├── TitoUnavailableError (ImportError) *** the tracewire[tito] extra is missing
    ├── SessionError (LookupError)          unknown, expired or deleted session (``reason``)
    ├── SampleError (ValueError)            samples cannot be assembled
    │   └── HookError                       a user hook raised; names the hook
    ├── EnvError (RuntimeError)             environment cannot be loaded or run
    │   ├── PhaseTimeout (TimeoutError)     a rollout phase ran past its deadline
    │   │   └── ExecTimeout **              a sandboxed command ran past its timeout
    │   ├── CommandFailed                   a CommandHarness program failed
    │   └── SandboxError **                 a runtime failed to boot, run, move files, clean up
    │       ├── RuntimeUnavailable **       the runtime cannot run here (tool, permission)
    │       └── ResourceLimitExceeded **    a command hit a cpu/memory/process/file limit
    ├── ServeError (RuntimeError)           env server / client failure
    │   ├── BusyError                       server queue full
    │   ├── WorkerDiedError                 the worker running a request died
    │   ├── RunTimeout (TimeoutError)       a run exceeded its deadline
    │   └── ProtocolError (ValueError)      malformed frame or version mismatch
    └── EngineError (RuntimeError)          a local inference engine cannot be built, fetched or run

``*`` are defined in ``tracewire.tito``, ``**`` in ``tracewire.runtime``, ``***`` in
``tracewire.tokens`` (they carry that part's data: an exec result, an HTTP status); the
rest here. Errors cross process
boundaries as ``{type, message, reason}`` (``tracewire._wire_errors``) and are rebuilt as
the same class. Errors from zmq, aiohttp and sqlite are translated at the boundary with
``raise ... from exc``.
"""

from __future__ import annotations

__all__ = [
    "BusyError",
    "CorruptRecordError",
    "DecodeError",
    "DeltaError",
    "EngineError",
    "EnvError",
    "HookError",
    "LimitError",
    "ModelError",
    "PhaseTimeout",
    "PlanError",
    "PlanTypeError",
    "ProtocolError",
    "ProxyError",
    "RunTimeout",
    "SampleError",
    "SchemaVersionError",
    "ServeError",
    "SessionError",
    "StoreError",
    "TracewireError",
    "UpstreamConfigError",
    "UpstreamError",
    "WorkerDiedError",
]


class TracewireError(Exception):
    """Root of every error tracewire raises on purpose."""


class DecodeError(TracewireError, ValueError):
    """Bytes that cannot be decoded: malformed, truncated, wrong version or failing a CRC."""


class DeltaError(DecodeError):
    """A delta that cannot be applied: lost, reordered, or for an unknown trace."""


class SchemaVersionError(DecodeError):
    """Data written by a schema version this build cannot read."""


class LimitError(TracewireError, ValueError):
    """Input over a configured bound (body size, turns, tokens, sessions, nodes)."""


class PlanError(TracewireError, ValueError):
    """An eval's options are out of range or contradict each other; names the option."""


class PlanTypeError(PlanError, TypeError):
    """An eval option has the wrong type, or no option has that name."""


class StoreError(TracewireError, OSError):
    """A run directory cannot be written or read (disk full, permissions, bad layout)."""


class CorruptRecordError(StoreError):
    """A stored record fails its framing or CRC check."""


class ModelError(TracewireError, RuntimeError):
    """The built-in model rejected a request or failed to generate."""


class ProxyError(TracewireError, RuntimeError):
    """The interception proxy or session server failed."""


class UpstreamError(ProxyError):
    """The upstream model server failed, timed out or answered with something unusable;
    ``status`` is the HTTP status to answer the harness with (the upstream's own 4xx, or
    502)."""

    def __init__(self, message: str = "", status: int = 502) -> None:
        super().__init__(message)
        self.status = status


class UpstreamConfigError(ProxyError, ValueError):
    """The upstream's base URL or headers cannot be used (not ``http(s)://HOST...``, a
    header holding a line break)."""


class SessionError(TracewireError, LookupError):
    """An unknown, expired or deleted session; ``reason`` says which (``"never_existed"``,
    ``"expired"``, ``"deleted"``, or ``""`` when not known)."""

    def __init__(self, message: str = "", reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason


class SampleError(TracewireError, ValueError):
    """Training samples cannot be assembled from a trace."""


class HookError(SampleError):
    """A user-supplied hook (picker, postprocessor, request/response hook) raised."""


class EnvError(TracewireError, RuntimeError):
    """An environment cannot be loaded or a rollout cannot run."""


class PhaseTimeout(EnvError, TimeoutError):
    """A rollout phase (boot, setup, agent, finalize, scoring) ran past its deadline."""


class EngineError(TracewireError, RuntimeError):
    """A local inference engine (llama.cpp's server) cannot be built, fetched or started;
    the message is one line naming what is missing."""


class ServeError(TracewireError, RuntimeError):
    """The env server or its client failed."""


class BusyError(ServeError):
    """The env server's bounded queue is full; try again later or elsewhere."""


class WorkerDiedError(ServeError):
    """The worker process running a request died before answering."""


class RunTimeout(ServeError, TimeoutError):
    """A run exceeded its server- or client-side deadline."""


class ProtocolError(ServeError, ValueError):
    """A malformed frame, or a peer speaking another protocol/schema version."""
