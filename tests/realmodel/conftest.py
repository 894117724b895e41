"""The real-engine lane: llama.cpp's ``llama-server`` on the SmolLM2-135M GGUF.

Session-scoped: one server for the whole lane (start-up ~1 s, the model stays mapped). The
binary and the model come from ``tracewire.engine``: ``$TRACEWIRE_LLAMA_SERVER`` or the
per-machine cache (built on first use; ``make test`` runs ``tracewire engine llamacpp
--prepare`` first so a fresh machine's one-time build is visible), and ``$TRACEWIRE_GGUF``
or the bundled model (fetched on first use). A missing binary or model fails the lane (it
is part of ``make test``), never skips.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tracewire.engine import EngineError, LlamaServer, bundled_model, find_llama_server


@pytest.fixture(scope="session")
def smollm_gguf() -> Path:
    """The bundled SmolLM2-135M-Instruct GGUF."""
    if os.environ.get("TRACEWIRE_GGUF"):
        return Path(os.environ["TRACEWIRE_GGUF"])
    try:
        return bundled_model()
    except EngineError as exc:
        pytest.fail(f"real-engine lane: {exc}")


@pytest.fixture(scope="session")
def llama_server_bin() -> Path:
    """The llama-server binary."""
    try:
        return find_llama_server(build=True)
    except EngineError as exc:
        pytest.fail(f"real-engine lane: {exc}")


@dataclass(frozen=True)
class LlamaServerProc:
    """A running llama-server: its base url (no /v1) and the model it serves."""

    url: str
    gguf: Path
    proc: subprocess.Popen[bytes]


@pytest.fixture(scope="session")
def llama_server(llama_server_bin: Path, smollm_gguf: Path) -> Iterator[LlamaServerProc]:
    """llama-server on 127.0.0.1, one thread (ggml threads spin when descheduled on a
    2-core machine), 2 slots of 8192 tokens each."""
    server = LlamaServer(smollm_gguf, binary=llama_server_bin, threads=1, ctx_size=16384,
                         parallel=2)
    try:
        server.start()
    except EngineError as exc:
        pytest.fail(f"real-engine lane: {exc}")
    try:
        assert server.process is not None
        yield LlamaServerProc(server.url, smollm_gguf, server.process)
    finally:
        server.stop()
