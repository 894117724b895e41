"""A tokenizer read from a GGUF file: the same ids, text and template as its source directory,
clear errors for what it cannot read, and an on-disk cache keyed by the file.

The GGUF files are written here from the fixture families (vocabulary-only, as llama.cpp's
own vocab test files are); the real model's file is checked against llama-server in
tests/realmodel/test_gguf_tokenizer.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import gguf
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracewire.tito import ChatTokenizer, PromptBuilder, TemplateError
from tracewire.tito import _gguf as gguf_mod
from tracewire.tito.fixtures import build_gguf_file, build_tokenizer_dir


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEWIRE_CACHE", str(tmp_path / "cache"))
    # Fixture vocabularies build in milliseconds; cache them anyway to test the cache.
    monkeypatch.setattr(gguf_mod, "CACHE_MIN_BUILD_S", 0.0)
    gguf_mod._memo.clear()


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[ChatTokenizer,
                                                                     ChatTokenizer]]:
    root = tmp_path_factory.mktemp("gguf")
    out = {}
    for fam in ("qwen25", "qwen3", "llama3"):
        out[fam] = (ChatTokenizer(build_gguf_file(root / f"{fam}.gguf", fam)),
                    ChatTokenizer(build_tokenizer_dir(root / fam, fam)))
    return out


TEXT = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=40) | st.lists(
    st.sampled_from(["<|im_start|>", "<|im_end|>", "<|eot_id|>", " ", "\n", "12", "don't",
                     "Paris", "你好", "🙂", "\t", "<tool_call>"]), max_size=8).map("".join)


@settings(max_examples=150, deadline=None)
@given(TEXT)
def test_gguf_encodes_and_decodes_as_its_directory(
        pair: dict[str, tuple[ChatTokenizer, ChatTokenizer]], text: str) -> None:
    for g, d in pair.values():
        ids = g.encode(text)
        assert ids == d.encode(text)
        assert g.decode(ids) == d.decode(ids) == text


def test_gguf_renders_and_probes_as_its_directory(
        pair: dict[str, tuple[ChatTokenizer, ChatTokenizer]]) -> None:
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"}, {"role": "user", "content": "bye"}]
    for g, d in pair.values():
        assert g.special == d.special and g.vocab_size == d.vocab_size
        assert g.eos_id == d.eos_id
        assert g.render(msgs) == d.render(msgs)
        bg, bd = PromptBuilder(g), PromptBuilder(d)
        assert bg.family == bd.family
        fg, fd = bg.render_full(msgs), bd.render_full(msgs)
        assert (fg.ids, fg.spans) == (fd.ids, fd.spans)


def test_smollm_pre_tokenizer_isolates_every_digit(tmp_path: Path) -> None:
    tok = ChatTokenizer(build_gguf_file(tmp_path / "s.gguf", "qwen25", pre="smollm"))
    ids = tok.encode("year 2026: 0123456789")
    digits = [tok.id_text(i) for i in ids if tok.id_text(i).strip().isdigit()]
    assert "".join(digits) == "20260123456789"
    assert all(len(d) == 1 for d in digits)
    assert tok.decode(ids) == "year 2026: 0123456789"


@pytest.mark.parametrize(("pre", "groups"), [("llama-bpe", ["123", "456", "7"]),
                                             ("qwen2", list("1234567")),
                                             ("smollm", list("1234567"))])
def test_digit_runs_split_as_the_pre_tokenizer_says(tmp_path: Path, pre: str,
                                                    groups: list[str]) -> None:
    tok = ChatTokenizer(build_gguf_file(tmp_path / f"{pre}.gguf", "qwen25", pre=pre))
    ids = tok.encode("1234567")
    # No token crosses a group boundary: the cumulative text hits every boundary.
    ends, at = set(), 0
    for i in ids:
        at += len(tok.id_text(i))
        ends.add(at)
    bounds = {sum(len(g) for g in groups[:k + 1]) for k in range(len(groups))}
    assert bounds <= ends and tok.decode(ids) == "1234567"


def _write(path: Path, **kv: object) -> Path:
    w = gguf.GGUFWriter(str(path), arch="llama")
    if "model" in kv:
        w.add_tokenizer_model(str(kv["model"]))
    if "tokens" in kv:
        w.add_token_list(list(kv["tokens"]))  # type: ignore[call-overload]
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    return path


@pytest.mark.parametrize(("make", "why"), [
    (lambda p: p / "missing.gguf", "no such tokenizer directory or GGUF file"),
    (lambda p: (p / "x.gguf").write_text("not gguf") and p / "x.gguf", "not GGUF"),
    (lambda p: _write(p / "a.gguf"), "carries no tokenizer"),
    (lambda p: _write(p / "b.gguf", model="llama", tokens=["a", "b"]),
     "tokenizer.ggml.model 'llama' is not supported"),
    (lambda p: build_gguf_file(p / "c.gguf", "qwen25", pre="deepseek-llm"),
     "tokenizer.ggml.pre 'deepseek-llm' is not supported"),
    (lambda p: build_gguf_file(p / "d.gguf", "qwen25", template=""), "no tokenizer.chat_template"),
    (lambda p: p, "no tokenizer.json"),
])
def test_unreadable_inputs_raise_one_template_error(tmp_path: Path, make: object,
                                                    why: str) -> None:
    path = make(tmp_path)  # type: ignore[operator]
    with pytest.raises(TemplateError, match=why):
        ChatTokenizer(path)


def test_the_built_tokenizer_is_cached_per_file(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    path = build_gguf_file(tmp_path / "t.gguf", "qwen25")
    first = ChatTokenizer(path).encode("hello <|im_end|> 42")
    cache = tmp_path / "cache" / "tokenizers"
    files = list(cache.glob("gguf-*.json"))
    assert len(files) == 1
    # A cached load reads no GGUF metadata at all.
    gguf_mod._memo.clear()

    def no_read(p: Path) -> dict[str, object]:
        raise AssertionError("read the GGUF file despite the cache")

    monkeypatch.setattr(gguf_mod, "_read", no_read)
    assert ChatTokenizer(path).encode("hello <|im_end|> 42") == first
    monkeypatch.undo()
    monkeypatch.setenv("TRACEWIRE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(gguf_mod, "CACHE_MIN_BUILD_S", 0.0)
    # A corrupt cache file is rebuilt; a changed file gets its own entry.
    files[0].write_text("{broken")
    gguf_mod._memo.clear()
    assert ChatTokenizer(path).encode("hello <|im_end|> 42") == first
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    ChatTokenizer(path)
    assert len(list(cache.glob("gguf-*.json"))) == 2


def test_an_unwritable_cache_only_costs_time(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("TRACEWIRE_CACHE", str(blocker))  # a file: no directory under it
    path = build_gguf_file(tmp_path / "u.gguf", "llama3")
    assert ChatTokenizer(path).encode("<|eot_id|>") == [ChatTokenizer(path).special[
        "<|eot_id|>"]]


def test_fast_builds_are_not_cached_and_the_cache_stays_bounded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache" / "tokenizers"
    monkeypatch.setattr(gguf_mod, "CACHE_MIN_BUILD_S", 3600.0)
    ChatTokenizer(build_gguf_file(tmp_path / "fast.gguf", "qwen25"))
    assert not list(cache.glob("gguf-*.json"))
    monkeypatch.setattr(gguf_mod, "CACHE_MIN_BUILD_S", 0.0)
    monkeypatch.setattr(gguf_mod, "MAX_CACHED", 2)
    src = build_gguf_file(tmp_path / "a.gguf", "qwen25")
    for k in range(4):
        p = tmp_path / f"copy{k}.gguf"
        p.write_bytes(src.read_bytes())
        ChatTokenizer(p)
    assert len(list(cache.glob("gguf-*.json"))) == 2
