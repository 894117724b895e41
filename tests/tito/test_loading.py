"""Loading a tokenizer directory: offline, typed errors for a bad directory, and a clear
error naming the extra when transformers is missing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tracewire.tito import ChatTokenizer, TemplateError, TitoUnavailableError


def test_missing_tokenizer_json(tmp_path: Path) -> None:
    with pytest.raises(TemplateError, match=r"tokenizer\.json"):
        ChatTokenizer(tmp_path)


def test_missing_chat_template(tmp_path: Path, tok_dirs: dict[str, Path]) -> None:
    d = tmp_path / "t"
    d.mkdir()
    (d / "tokenizer.json").write_bytes((tok_dirs["qwen25"] / "tokenizer.json").read_bytes())
    cfg = json.loads((tok_dirs["qwen25"] / "tokenizer_config.json").read_text())
    del cfg["chat_template"]
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(TemplateError, match="chat_template"):
        ChatTokenizer(d)


def test_broken_template_is_a_template_error(tmp_path: Path, tok_dirs: dict[str, Path]
                                             ) -> None:
    d = tmp_path / "b"
    d.mkdir()
    (d / "tokenizer.json").write_bytes((tok_dirs["qwen25"] / "tokenizer.json").read_bytes())
    cfg = json.loads((tok_dirs["qwen25"] / "tokenizer_config.json").read_text())
    cfg["chat_template"] = "{{ raise_exception('no system role') }}"
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    tok = ChatTokenizer(d)
    with pytest.raises(TemplateError, match="no system role"):
        tok.render([{"role": "user", "content": "x"}])


def test_loads_offline_in_a_fresh_process(tok_dirs: dict[str, Path]) -> None:
    # A fresh interpreter with the hub unreachable by configuration: the directory is enough.
    code = ("import os; os.environ['HF_HUB_OFFLINE']='1';"
            "from tracewire.tito import ChatTokenizer, PromptBuilder;"
            f"b = PromptBuilder(ChatTokenizer({str(tok_dirs['llama3'])!r}));"
            "print(b.family.name, b.family.close)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.split() == ["llama3", "<|eot_id|>"]


def test_missing_extra_names_it(monkeypatch: pytest.MonkeyPatch, tok_dirs: dict[str, Path]
                                ) -> None:
    # Simulate an install without the extra: the import of transformers fails.
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(TitoUnavailableError, match=r"tracewire\[tito\]") as ei:
        ChatTokenizer(tok_dirs["qwen25"])
    assert isinstance(ei.value, ImportError)
