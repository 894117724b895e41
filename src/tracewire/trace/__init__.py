"""Data model: episodes, traces, message-graph nodes, calls, and token columns."""

from ._branch import Branch
from ._columns import BASE_COLUMNS, Columns
from ._digest import chat_message_digest, hash16, message_digest
from ._endpoint import Endpoint
from ._info import InfoKey
from ._model import (
    SCHEMA_VERSION,
    Call,
    ErrorInfo,
    Link,
    Message,
    Node,
    Reward,
    Span,
    ToolCall,
)
from ._stop import StopReason
from ._trace import EPISODE_FIELDS, SCALAR_FIELDS, Episode, Trace, Watcher, new_id

__all__ = [
    "BASE_COLUMNS",
    "EPISODE_FIELDS",
    "SCALAR_FIELDS",
    "SCHEMA_VERSION",
    "Branch",
    "Call",
    "Columns",
    "Endpoint",
    "Episode",
    "ErrorInfo",
    "InfoKey",
    "Link",
    "Message",
    "Node",
    "Reward",
    "Span",
    "StopReason",
    "ToolCall",
    "Trace",
    "Watcher",
    "chat_message_digest",
    "hash16",
    "message_digest",
    "new_id",
]
