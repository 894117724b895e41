"""The tokenizer/template core: a model's own tokenizer and chat template, loaded offline.

A local tokenizer directory (``tokenizer.json`` + ``tokenizer_config.json`` holding
``chat_template``) or a GGUF model file (its tokenizer metadata, built to encode as
llama.cpp does) becomes a :class:`ChatTokenizer` through ``transformers``, without torch
(the optional extra ``tracewire[tito]``, imported only when a tokenizer is loaded);
:func:`probe_family` learns the template's family rules (tool-call format, what ends a
turn). It knows nothing of the proxy: token-in/token-out (``tracewire.tito``), the built-in
model serving a foreign tokenizer and the viewer all build on it.
"""

from ._errors import TemplateError, TitoUnavailableError
from ._family import (
    DUMMY_ASSISTANT,
    Family,
    FamilyName,
    LengthRule,
    ToolFormat,
    dummy_prefixes,
    probe_family,
)
from ._gguf import GgufTokenizer, gguf_cache_dir, is_gguf, load_gguf
from ._tokenizer import (
    ChatTokenizer,
    IncrementalDecoder,
    chat_messages,
    check_tokenizer,
    decoded_arguments,
)

__all__ = [
    "DUMMY_ASSISTANT",
    "ChatTokenizer",
    "Family",
    "FamilyName",
    "GgufTokenizer",
    "IncrementalDecoder",
    "LengthRule",
    "TemplateError",
    "TitoUnavailableError",
    "ToolFormat",
    "chat_messages",
    "check_tokenizer",
    "decoded_arguments",
    "dummy_prefixes",
    "gguf_cache_dir",
    "is_gguf",
    "load_gguf",
    "probe_family",
]
