"""Shared fixtures: one real model server per test module, on a loopback port."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tracewire.model import ModelServer, ServerThread

# the environment formats (system prompts, tool schemas) live next to the trainer
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    handle = ModelServer.run_in_thread(seed=7)
    try:
        yield handle
    finally:
        handle.stop()


@pytest.fixture(scope="module")
def base_url(server: ServerThread) -> str:
    return server.base_url


@pytest.fixture(scope="module")
def root_url(server: ServerThread) -> str:
    return server.base_url.removesuffix("/v1")
