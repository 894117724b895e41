"""The real-engine lane: llama.cpp's ``llama-server`` on the SmolLM2-135M GGUF.

Session-scoped: one server for the whole lane (start-up ~1 s, the model stays mapped).
Where the binary and the model come from: ``$TRACEWIRE_LLAMA_SERVER`` /
``$TRACEWIRE_GGUF`` when set, else the per-machine cache that ``tracewire engine``
fills. A missing binary or model fails the lane (it is part of ``make test``), never skips.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest


def _cache_root() -> Path:
    if os.environ.get("TRACEWIRE_CACHE"):
        return Path(os.environ["TRACEWIRE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tracewire"


def _find(env: str, candidates: list[Path]) -> Path:
    if os.environ.get(env):
        return Path(os.environ[env])
    for c in candidates:
        if c.is_file():
            return c
    pytest.fail(f"real-engine lane: set {env} or run `tracewire engine llamacpp --prepare`"
                f" (looked in {', '.join(map(str, candidates))})")


@pytest.fixture(scope="session")
def smollm_gguf() -> Path:
    """The bundled SmolLM2-135M-Instruct GGUF."""
    return _find("TRACEWIRE_GGUF",
                 [_cache_root() / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"])


@pytest.fixture(scope="session")
def llama_server_bin() -> Path:
    """The llama-server binary."""
    return _find("TRACEWIRE_LLAMA_SERVER",
                 sorted((_cache_root() / "llama.cpp").glob("*/llama-server"), reverse=True))


@dataclass(frozen=True)
class LlamaServerProc:
    """A running llama-server: its base url (no /v1) and the model it serves."""

    url: str
    gguf: Path
    proc: subprocess.Popen[bytes]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def llama_server(llama_server_bin: Path, smollm_gguf: Path,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServerProc]:
    """llama-server on 127.0.0.1, one thread per slot (ggml threads spin when descheduled
    on a 2-core machine), 2 slots of 8192 tokens each."""
    port = _free_port()
    log = tmp_path_factory.mktemp("llama") / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(llama_server_bin), "-m", str(smollm_gguf), "--host", "127.0.0.1",
             "--port", str(port), "-t", "1", "-tb", "1", "-c", "16384", "-np", "2",
             "--no-webui"],
            stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                pytest.fail(f"llama-server exited {proc.returncode}: "
                            f"{log.read_text(errors='replace')[-2000:]}")
            with contextlib.suppress(OSError), \
                    urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    break
            if time.monotonic() > deadline:
                pytest.fail("llama-server did not become healthy in 120 s")
            time.sleep(0.2)
        yield LlamaServerProc(url, smollm_gguf, proc)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
