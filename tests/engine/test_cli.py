"""``tracewire engine`` on bad input: one line on stderr, exit status 2, nothing started."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("argv, says", [
    (["llamacpp", "--port", "70000"], "--port 70000 is not in 0..65535"),
    (["llamacpp", "--parallel", "0"], "--parallel must be >= 1"),
    (["llamacpp", "--threads", "0"], "--threads must be >= 1"),
    (["llamacpp", "--ctx-size", "1", "--parallel", "2"], "--ctx-size must be at least one"),
    (["llamacpp", "--model", "/no/such.gguf"], "--model /no/such.gguf is not a file"),
    (["llamacpp", "--port", "x"], "invalid int value: 'x'"),
    (["vllm"], "invalid choice: 'vllm'"),
])
def test_bad_input_is_one_line_and_exit_2(argv: list[str], says: str) -> None:
    done = subprocess.run([sys.executable, "-m", "tracewire", "engine", *argv],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and says in lines[0], done.stderr
    assert lines[0].startswith("tracewire engine: ")
