"""Every command that takes ``--tokenizer`` turns a bad one into one line on stderr and exit
status 2: a missing path, a file that is not GGUF, a directory without ``tokenizer.json``,
a missing extra (the module blocked in ``sys.modules``, as if not installed), and a
tokenizer that passes the checks but fails to load. Real subprocesses of the real CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

#: Each command with the other arguments it needs to get as far as its tokenizer.
COMMANDS = {
    "proxy": ["proxy", "--upstream", "http://127.0.0.1:9/v1"],
    "eval": ["eval", "arithmetic", "-n", "1"],
    "serve": ["serve", "arithmetic"],
    "model": ["model"],
}


def _run(argv: list[str], block: str | None = None) -> subprocess.CompletedProcess[str]:
    pre = f"sys.modules[{block!r}] = None; " if block else ""
    code = f"import sys; {pre}from tracewire.cli import main; sys.exit(main({argv!r}))"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False)


def _one_line(out: subprocess.CompletedProcess[str], cmd: str, why: str) -> None:
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith(f"tracewire {cmd}: ") and why in lines[0], lines[0]
    assert "Traceback" not in out.stderr


@pytest.fixture(scope="module")
def bad(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bad")
    (root / "notes.txt").write_text("not a tokenizer")
    (root / "empty").mkdir()
    return {"missing": root / "nope.gguf", "text": root / "notes.txt",
            "empty": root / "empty"}


@pytest.mark.parametrize("cmd", sorted(COMMANDS))
@pytest.mark.parametrize(("kind", "why"), [
    ("missing", "no such tokenizer directory or GGUF file"),
    ("text", "a file that is not GGUF"),
    ("empty", "no tokenizer.json"),
])
def test_bad_tokenizer_path_is_one_line(cmd: str, kind: str, why: str,
                                        bad: dict[str, Path]) -> None:
    _one_line(_run([*COMMANDS[cmd], "--tokenizer", str(bad[kind])]), cmd, why)


@pytest.mark.parametrize(("cmd", "block"), [("proxy", "tokenizers"), ("model", "jinja2"),
                                            ("eval", "gguf"), ("serve", "tokenizers")])
def test_missing_extra_is_one_line(cmd: str, block: str, tmp_path: Path) -> None:
    from tracewire.tito.fixtures import build_gguf_file

    path = build_gguf_file(tmp_path / "t.gguf", "qwen25")
    _one_line(_run([*COMMANDS[cmd], "--tokenizer", str(path)], block), cmd,
              "pip install 'tracewire[tito]'")


@pytest.mark.parametrize("cmd", ["proxy", "model"])
def test_a_tokenizer_that_fails_to_load_is_one_line(cmd: str, tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text("{not json")
    _one_line(_run([*COMMANDS[cmd], "--tokenizer", str(tmp_path)]), cmd, "cannot load")
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 64)
    _one_line(_run([*COMMANDS[cmd], "--tokenizer", str(broken)]), cmd,
              "not a readable GGUF file")
