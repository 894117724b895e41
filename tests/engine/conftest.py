"""The engine part's tests run against a temporary cache (``$TRACEWIRE_CACHE``), so nothing
they do touches the machine's real cache of built engines and fetched models."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("TRACEWIRE_CACHE", str(root))
    monkeypatch.delenv("TRACEWIRE_LLAMA_SERVER", raising=False)
    return root


@pytest.fixture
def offline_pip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """pip sees no configuration and only a local folder of distributions (empty unless a
    test puts files there): the tests never reach a registry."""
    links = tmp_path / "links"
    links.mkdir()
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    return links
