"""What a session is created with, and the closed vocabularies of the session API."""

from __future__ import annotations

import os
import stat
from enum import StrEnum
from typing import Annotated, Any

import msgspec

from .._errors import ProxyError

__all__ = ["TOKEN_ENV", "TOKEN_FILE_ENV", "GoneReason", "SessionSpec", "SessionStatus",
           "decode_spec", "read_token_file", "token_from_env"]

#: Environment variable holding the trainer token of the session API.
TOKEN_ENV = "TRACEWIRE_SESSION_TOKEN"
#: Environment variable naming a file (mode 0600) that holds the trainer token: unlike the
#: token itself, the path tells an agent that can read the environment nothing.
TOKEN_FILE_ENV = "TRACEWIRE_SESSION_TOKEN_FILE"


class SessionStatus(StrEnum):
    """A session's life: ``active`` until deleted or expired, then ``closed``."""

    ACTIVE = "active"
    CLOSED = "closed"


class GoneReason(StrEnum):
    """Why a session id names no live session (``SessionError.reason``)."""

    NEVER_EXISTED = "never_existed"
    EXPIRED = "expired"
    DELETED = "deleted"


class SessionSpec(msgspec.Struct, kw_only=True, forbid_unknown_fields=True,
                  omit_defaults=True):
    """The fields a session is created with (``POST /sessions`` body,
    ``SessionClient.create``, ``Proxy.create_session``); None means the proxy's default."""

    #: Trainer data kept with the session and copied into every sample's metadata.
    metadata: dict[str, Any] = {}
    #: Seconds the session lives after its last use.
    ttl: Annotated[float, msgspec.Meta(gt=0, lt=1e9)] | None = None
    #: Rollouts of one prompt share a group id; ``group_index`` orders them.
    group_id: str | None = None
    group_index: Annotated[int, msgspec.Meta(ge=0)] = 0
    #: Per-session bounds on committed turns and on one turn's prompt + completion tokens.
    max_turns: Annotated[int, msgspec.Meta(ge=1)] | None = None
    max_tokens: Annotated[int, msgspec.Meta(ge=1)] | None = None


_decode = msgspec.json.Decoder(SessionSpec).decode


def decode_spec(body: bytes) -> SessionSpec:
    """A :class:`SessionSpec` from JSON bytes (empty: all defaults); ``ValueError`` naming
    the offending field when malformed."""
    if not body.strip():
        return SessionSpec()
    try:
        return _decode(body)
    except msgspec.ValidationError as exc:
        raise ValueError(f"bad session fields: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise ValueError(f"request body is not valid JSON: {exc}") from exc


def token_from_env() -> str | None:
    """The trainer token set in :data:`TOKEN_ENV`, else read from the file
    :data:`TOKEN_FILE_ENV` names (see :func:`read_token_file`), else None."""
    token = os.environ.get(TOKEN_ENV)
    if token:
        return token
    path = os.environ.get(TOKEN_FILE_ENV)
    return read_token_file(path) if path else None


def read_token_file(path: str) -> str:
    """The token in ``path`` (surrounding whitespace stripped); ``ProxyError`` when it is
    missing, empty, over 4 KiB, or readable by group or others."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOCTTY)
    except OSError as exc:
        raise ProxyError(f"cannot read the session token file {path}: {exc.strerror}") from exc
    with os.fdopen(fd, "rb") as f:
        mode = os.fstat(f.fileno()).st_mode
        if mode & 0o077:
            raise ProxyError(f"session token file {path} is readable by group or others "
                             f"(mode {stat.S_IMODE(mode):o}); chmod 600 it")
        data = f.read(4097)
    token = data.decode("utf-8", "replace").strip()
    if not token or len(data) > 4096 or "\n" in token:
        raise ProxyError(f"session token file {path} must hold one token on one line")
    return token
