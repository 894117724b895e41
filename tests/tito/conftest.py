"""Fixture tokenizer directories (tiny byte-level BPEs + family templates), built once."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="needs the tracewire[tito] extra (transformers)")

from tracewire.tito import ChatTokenizer, PromptBuilder
from tracewire.tito.fixtures import FAMILIES, build_tokenizer_dir


@pytest.fixture(scope="session")
def tok_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tokenizers")
    return {name: build_tokenizer_dir(root / name, name) for name in FAMILIES}


@pytest.fixture(scope="session")
def toks(tok_dirs: dict[str, Path]) -> dict[str, ChatTokenizer]:
    # The same loader users run: AutoTokenizer on a local directory, offline.
    return {name: ChatTokenizer(d) for name, d in tok_dirs.items()}


@pytest.fixture(params=sorted(FAMILIES))
def family(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def builder(toks: dict[str, ChatTokenizer], family: str) -> PromptBuilder:
    return PromptBuilder(toks[family])
