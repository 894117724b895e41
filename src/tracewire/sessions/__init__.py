"""Trainer side of the proxy's session API: create a session per rollout, collect its
samples, delete it. Needs the proxy's trainer token (``TRACEWIRE_SESSION_TOKEN``, a 0600
file named by ``TRACEWIRE_SESSION_TOKEN_FILE``, or ``token=``); imports no part of the proxy
server.
"""

from ._client import SessionClient, SessionInfo, SyncSessionClient
from ._spec import (
    TOKEN_ENV,
    TOKEN_FILE_ENV,
    GoneReason,
    SessionSpec,
    SessionStatus,
    decode_spec,
    read_token_file,
    token_from_env,
)

__all__ = [
    "TOKEN_ENV",
    "TOKEN_FILE_ENV",
    "GoneReason",
    "SessionClient",
    "SessionInfo",
    "SessionSpec",
    "SessionStatus",
    "SyncSessionClient",
    "decode_spec",
    "read_token_file",
    "token_from_env",
]
