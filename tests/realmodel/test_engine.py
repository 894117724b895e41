"""``tracewire.engine`` on the real llama-server: start, health, slots, stop; the command
``tracewire engine llamacpp`` stops its child on SIGINT/SIGTERM (no orphan)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import aiohttp
import pytest

from tracewire.engine import (
    EngineError,
    LlamaServer,
    bundled_model,
    default_threads,
    find_llama_server,
)

from .relay import gone


def _get(url: str) -> dict[str, object]:
    with urllib.request.urlopen(url, timeout=30) as r:
        out: dict[str, object] = json.loads(r.read())
    return out


def _refused(url: str) -> bool:
    try:
        urllib.request.urlopen(url + "/health", timeout=5).close()
    except OSError:
        return True
    return False


def test_sync_server_slots_and_stop(llama_server_bin: Path, smollm_gguf: Path) -> None:
    server = LlamaServer(smollm_gguf, binary=llama_server_bin, parallel=2, ctx_size=4096)
    with server:
        assert server.url.startswith("http://127.0.0.1:")
        assert server.model == smollm_gguf
        props = _get(server.url + "/props")
        assert props["total_slots"] == 2
        settings = props["default_generation_settings"]
        assert isinstance(settings, dict) and settings["n_ctx"] == 2048  # 4096 over 2 slots
        assert server.process is not None
        pid, url = server.process.pid, server.url
        # One thread per slot on a small machine, llama.cpp's choice on a big one.
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        threads = default_threads(2)
        if threads is None:
            assert b"--threads" not in argv
        else:
            assert argv[argv.index(b"--threads") + 1] == str(threads).encode()
    assert server.process is None
    assert gone(pid) and _refused(url)


async def test_async_server_completes_and_stops(llama_server_bin: Path,
                                                smollm_gguf: Path) -> None:
    async with LlamaServer(smollm_gguf, binary=llama_server_bin) as server:
        assert server.process is not None
        pid, url = server.process.pid, server.url
        async with aiohttp.ClientSession() as http, http.post(
                url + "/completion", json={"prompt": [1, 4093, 198], "n_predict": 4,
                                           "seed": 3, "return_tokens": True}) as resp:
            out = await resp.json()
        assert 0 < len(out["tokens"]) <= 4
    assert gone(pid) and _refused(url)


def test_bad_model_is_one_line_with_the_servers_reason(llama_server_bin: Path,
                                                       tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"not a gguf file at all" * 100)
    server = LlamaServer(bogus, binary=llama_server_bin)
    with pytest.raises(EngineError) as err:
        server.start()
    text = str(err.value)
    assert "llama-server exited with status" in text and "\n" not in text
    assert server.process is None


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        kids += [int(x) for x in (task / "children").read_text().split()]
    return kids


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_command_prints_url_and_model_and_leaves_no_orphan(sig: signal.Signals,
                                                           tmp_path: Path) -> None:
    err = (tmp_path / "stderr").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "tracewire", "engine", "llamacpp"],
                            stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        assert proc.stdout is not None
        first, second = proc.stdout.readline(), proc.stdout.readline()
        assert first.startswith("url: http://127.0.0.1:"), (tmp_path / "stderr").read_text()
        url = first.split(" ", 1)[1].strip()
        assert second == f"model: {bundled_model()}\n"
        assert _get(url + "/health") == {"status": "ok"}
        kids = _children(proc.pid)
        assert len(kids) == 1
        assert Path(f"/proc/{kids[0]}/exe").resolve() == find_llama_server().resolve()
        proc.send_signal(sig)
        assert proc.wait(timeout=60) == 0
        assert gone(kids[0]) and _refused(url)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
        err.close()


def test_prepare_prints_the_paths() -> None:
    done = subprocess.run([sys.executable, "-m", "tracewire", "engine", "llamacpp",
                           "--prepare"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"llama-server: {find_llama_server()}",
                                        f"model: {bundled_model()}"]
