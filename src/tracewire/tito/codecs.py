"""The token-in/token-out endpoint codecs (vLLM completions and generate, SGLang generate,
llama.cpp's llama-server ``/completion``) and the bounds every reply is checked against."""

from __future__ import annotations

from ._codecs import (
    ID_BOUND,
    LENGTH_SLACK,
    Generation,
    GenerationDelta,
    SamplingParams,
    StreamDecoder,
    UpstreamApi,
    check_ids,
    decode_response,
    encode_request,
    error_message,
    refusal,
    request_path,
    sampling_keys,
)

__all__ = ["ID_BOUND", "LENGTH_SLACK", "Generation", "GenerationDelta", "SamplingParams",
           "StreamDecoder", "UpstreamApi", "check_ids", "decode_response", "encode_request",
           "error_message", "refusal", "request_path", "sampling_keys"]
