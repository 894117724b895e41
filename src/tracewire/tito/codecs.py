"""The token-in/token-out endpoint codecs (vLLM completions and generate, SGLang generate)."""

from __future__ import annotations

from ._codecs import (
    Generation,
    GenerationDelta,
    SamplingParams,
    StreamDecoder,
    UpstreamApi,
    decode_response,
    encode_request,
    error_message,
    request_path,
)

__all__ = ["Generation", "GenerationDelta", "SamplingParams", "StreamDecoder", "UpstreamApi",
           "decode_response", "encode_request", "error_message", "request_path"]
