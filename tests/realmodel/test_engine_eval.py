"""``evaluate(..., engine="llamacpp")`` end to end on the real model, checked on the wire.

For every bundled text environment and an unmodified openai SDK multi-turn loop (streamed
and not), the eval starts llama-server itself — through ``TRACEWIRE_LLAMA_SERVER``, a
stand-in binary that runs the real server behind a recording relay — and serves it
token-in/token-out. The relay's captured JSON is parsed here with ``json`` alone: every
sampled id and logprob in the stored trace equals what llama-server returned, bit for bit;
every prompt extends the previous prompt + sampled ids + the rendered suffix, except
re-renders the proxy counted with a reason; the mismatch report is 0 in each episode's
info and in the eval summary.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tracewire.compose import evaluate

from .relay import gone, pids, read_log, wrapper_script
from .wire import check_against_wire, completion_turns

SDK_LOOP = str(Path(__file__).with_name("sdk_loop_env.py"))
#: (environment, tasks): enough turns to meet non-canonical samples, few enough for 2 cores.
CASES = [("arithmetic", 3), ("guess", 2), ("tools", 2), ("command", 3), (SDK_LOOP, None)]


def _relayed(tmp_path: Path, real: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    log = tmp_path / "wire.jsonl"
    monkeypatch.setenv("TRACEWIRE_LLAMA_SERVER", str(wrapper_script(tmp_path, real, log)))
    return log


@pytest.mark.parametrize("env, n", CASES, ids=["arithmetic", "guess", "tools", "command",
                                               "sdk_loop"])
async def test_eval_on_the_engine_is_token_exact_on_the_wire(
        env: str, n: int | None, tmp_path: Path, llama_server_bin: Path,
        smollm_gguf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = _relayed(tmp_path, llama_server_bin, monkeypatch)
    # concurrency 1: the wire's order is the episodes' order, so each call finds its turn.
    result = await evaluate(env, engine="llamacpp", n=n, concurrency=1, out=tmp_path / "run",
                            seed=7)
    assert result.status == "complete" and result.reason is None
    assert result.run.meta["config"]["model"] == smollm_gguf.stem
    turns = completion_turns(read_log(log))
    assert turns, "nothing reached llama-server"
    at = 0
    episodes = list(result.run.episodes())
    assert len(episodes) == result.summary.episodes
    reports = []
    failed: list[str] = []
    for ep in episodes:
        for trace in ep.traces:
            got = check_against_wire(trace, turns, at)
            at = got.at
            assert got.rerenders == sum(trace.info["tito"]["rerenders"].values())
            failed += got.errors
            reports.append((trace.info["tito"], trace.calls[-1].finish_reason))
    assert at == len(turns)  # every exchange on the wire belongs to a recorded call
    assert not failed, failed
    if env == SDK_LOOP:
        # The SDK asked both ways; the proxy streamed from the engine when it streamed.
        assert {t.stream for t in turns} == {False, True}
    # Last, the mismatch report (a canonical re-render against the recorded ids: benign
    # re-tokenizations of the model's own text are not counted).
    assert [ep.info["tito_mismatch"] for ep in episodes] == [r["mismatch"] for r, _ in reports]
    assert result.summary.tito_mismatch == sum(r["mismatch"] for r, _ in reports)
    bad = [(r, finish) for r, finish in reports if r["mismatch"]]
    assert not bad, bad
    assert result.summary.tito_mismatch == 0


def test_eval_command_starts_and_stops_the_engine(tmp_path: Path, llama_server_bin: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    log = _relayed(tmp_path, llama_server_bin, monkeypatch)
    done = subprocess.run([sys.executable, "-m", "tracewire", "eval", "arithmetic",
                           "--engine", "llamacpp", "-n", "1", "-q", "--out",
                           str(tmp_path / "run")], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert completion_turns(read_log(log))
    # The stand-in and the real server behind it are gone.
    assert len(pids(log)) == 2 and all(gone(p) for p in pids(log))


def test_eval_engine_refuses_a_base_url(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "tracewire", "eval", "arithmetic",
                           "--engine", "llamacpp", "--base-url", "http://127.0.0.1:1/v1"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "tracewire eval: --engine serves its own model: drop --base-url/--tokenizer"]


def test_eval_interrupted_stops_the_engine(tmp_path: Path, llama_server_bin: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    log = _relayed(tmp_path, llama_server_bin, monkeypatch)
    proc = subprocess.Popen([sys.executable, "-m", "tracewire", "eval", "guess", "--engine",
                             "llamacpp", "-q", "--out", str(tmp_path / "run")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # Interrupt once the engine has answered a turn.
        deadline = time.monotonic() + 120
        while not completion_turns(read_log(log)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert completion_turns(read_log(log))
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert len(pids(log)) == 2 and all(gone(p) for p in pids(log))
