"""Token-in/token-out: the proxy renders prompts itself and keeps the sampled ids verbatim.

Rendering loads a local tokenizer directory (``tokenizer.json`` + ``tokenizer_config.json``
with ``chat_template``) or a GGUF model file (its tokenizer metadata, built to encode as
llama.cpp does) through ``transformers``, offline and without torch; it needs the optional
extra ``tracewire[tito]``, imported only when a tokenizer is loaded.
:class:`TokenSession` resolves each request's history, bridges (recorded ids + junction +
suffix) or re-renders with a reason; :func:`parse_completion` / :class:`StreamParser` turn
the completion text back into an assistant message; ``tracewire.tito.codecs`` speaks the
token-in endpoints of vLLM, SGLang and llama.cpp's llama-server; :func:`mismatch_report`
compares a branch with a canonical re-render.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..tokens import (
    ChatTokenizer,
    Family,
    FamilyName,
    GgufTokenizer,
    IncrementalDecoder,
    LengthRule,
    ToolFormat,
    chat_messages,
    check_tokenizer,
    is_gguf,
    load_gguf,
    probe_family,
)
from ._errors import (
    BridgeError,
    TemplateError,
    TitoUnavailableError,
    TruncatedTurnError,
    UpstreamShapeError,
)
from ._history import (
    Continuation,
    ContinuationKind,
    ConversationIndex,
    RecordedTurn,
    RerenderReason,
    message_digest,
)
from ._mismatch import Difference, DifferenceKind, MismatchReport, mismatch_report
from ._parse import ParsedCall, ParsedCompletion
from ._render import PromptBuilder, Rendered
from ._session import BranchTip, Plan, TokenSession
from ._stream import EventKind, StreamEvent, StreamParser, parse_completion

if TYPE_CHECKING:
    from ._token_upstream import TokenUpstream


def __getattr__(name: str) -> object:
    # TokenUpstream pulls in the proxy and aiohttp: load it only when asked for.
    if name == "TokenUpstream":
        from ._token_upstream import TokenUpstream

        return TokenUpstream
    raise AttributeError(name)

__all__ = [
    "BranchTip",
    "BridgeError",
    "ChatTokenizer",
    "Continuation",
    "ContinuationKind",
    "ConversationIndex",
    "Difference",
    "DifferenceKind",
    "EventKind",
    "Family",
    "FamilyName",
    "GgufTokenizer",
    "IncrementalDecoder",
    "LengthRule",
    "MismatchReport",
    "ParsedCall",
    "ParsedCompletion",
    "Plan",
    "PromptBuilder",
    "RecordedTurn",
    "Rendered",
    "RerenderReason",
    "StreamEvent",
    "StreamParser",
    "TemplateError",
    "TitoUnavailableError",
    "TokenSession",
    "TokenUpstream",
    "ToolFormat",
    "TruncatedTurnError",
    "UpstreamShapeError",
    "chat_messages",
    "check_tokenizer",
    "is_gguf",
    "load_gguf",
    "message_digest",
    "mismatch_report",
    "parse_completion",
    "probe_family",
]
