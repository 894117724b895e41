"""The GGUF tokenizer encodes and decodes exactly as llama-server does, on the same file.

Every string of a corpus built here (scripts, emoji, combining marks, digit runs, whitespace
runs, special tokens inline and broken, code, contractions) and of hypothesis-generated text
goes through ``ChatTokenizer(gguf).encode`` and llama-server's ``/tokenize``
(``parse_special``: special-token text is a special token, as the proxy renders prompts);
the ids must be equal. ``/detokenize`` of those ids, and of random id sequences, must equal
``ChatTokenizer.decode``.
"""

from __future__ import annotations

import http.client
import json
import random
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tracewire.tito import ChatTokenizer, PromptBuilder

from .conftest import LlamaServerProc

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<repo_name>", "<file_sep>",
           "<jupyter_code>", "<empty_output>"]

SCRIPTS = [
    "The quick brown fox jumps over the lazy dog.",
    "日本語のテキストと漢字、ひらがな、カタカナ。", "中文分词测试：你好，世界！",
    "한국어 문장입니다.",
    "Русский текст с ёлкой.", "Ελληνικά γράμματα", "العربية من اليمين إلى اليسار",
    "עברית", "हिन्दी देवनागरी", "ภาษาไทยไม่มีช่องว่าง", "Tiếng Việt có dấu",
    "emoji 😀👍🏽🇫🇷 family 👨‍👩‍👧‍👦 keycap 1️⃣", "e\u0301 a\u0308 n\u0303 Z\u0351\u0352\u0353",
    "ﬁ ligature ＦＵＬＬＷＩＤＴＨ ｶﾀｶﾅ", "math ∑∫∂√∞ ≤ ≥ ≠ ±", "½ ¾ ² ³ Ⅻ ٣ ४ ௫ 𝟘",
    "zero\u200bwidth\u200djoiner\u2060", "nbsp\u00a0thin\u2009em\u2003ideographic\u3000",
    "line\u2028sep\u2029para\x85nel", "\ufeffbom", "tab\tvtab\x0bform\x0c", "\x00nul\x01",
]
CODE = [
    "def f(x):\n    return x ** 2  # square\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    'print("hello, world!")\n\n\n',
    "SELECT * FROM users WHERE id = 42;",
    "  \tindented\n\t\tmore\n    spaces    \n",
    '{"name": "get_weather", "arguments": {"city": "Paris"}}',
    "<tool_call>\n{\"name\": \"f\"}\n</tool_call>",
    "if x != y && z >= 0 || !w { return -1; }",
    "https://example.org/path?q=1&r=2#frag",
    "$HOME/.cache/*.gguf ~/x @user #tag %20 ^_^ `code` |pipe|",
]
WORDS = ["don't", "I'll", "we've", "they're", "she's", "I'm", "you'd", "DON'T", "It'S",
         "o'clock", "rock'n'roll", "'quoted'", "hello", "world", "Hello", "WORLD",
         "tokenization", "supercalifragilistic", "naïve", "café", "Zürich"]
PIECES = [*WORDS, " ", "  ", "   ", "\n", "\n\n", "\t", " \n", "\r\n", "0", "7", "42",
          "2026", "3.14159", "1,000,000", "-12", "+1e-9", "!", "?!", "...", ",", ";", "—",
          "(", ")", "[", "]", "{", "}", "<", ">", "</", "/>", "<|", "|>", "<|im_", "im_end",
          *SPECIAL, *SCRIPTS[:16]]


def build_corpus(n: int = 3000, seed: int = 22) -> list[str]:
    """Hand-picked strings, then random concatenations of pieces and raw code points."""
    rng = random.Random(seed)
    out = [*SCRIPTS, *CODE, *WORDS, *SPECIAL, "", " ", "  leading", "trailing  ", "\n",
           "9" * 200, "1234567890" * 30, "12 345 6789 0.5 1e10", " " * 50, "\n" * 20,
           "\t" * 9, " \t \n \r\n ", "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
           "<|im_start|><|im_end|><|endoftext|>", "<|im_start", "im_start|>", "<<|im_end|>>",
           " <|im_end|> ", "x<|im_end|>y", "<|im_end|><|im_end|>"]
    ranges = [(0x20, 0x7E), (0xA0, 0x24F), (0x300, 0x36F), (0x370, 0x3FF), (0x400, 0x4FF),
              (0x590, 0x6FF), (0x900, 0x97F), (0xE00, 0xE7F), (0x1100, 0x11FF),
              (0x2000, 0x206F), (0x3000, 0x30FF), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3),
              (0xFF00, 0xFFEF), (0x1F300, 0x1FAFF), (0x1D400, 0x1D7FF), (0x0, 0x1F)]
    while len(out) < n:
        k = rng.random()
        if k < 0.55:
            sep = rng.choice(["", " ", "", "\n", "  "])
            s = sep.join(rng.choice(PIECES) for _ in range(rng.randint(1, 12)))
        elif k < 0.85:
            lo, hi = rng.choice(ranges)
            s = "".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 30)))
        else:
            s = "".join(rng.choice(PIECES) if rng.random() < 0.5 else
                        chr(rng.randint(*rng.choice(ranges))) for _ in range(rng.randint(1, 20)))
        out.append(s)
    return out


class Server:
    """A keep-alive connection to llama-server's tokenize endpoints."""

    def __init__(self, url: str) -> None:
        u = urlsplit(url)
        self.conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port, timeout=60)

    def _post(self, path: str, body: dict[str, object]) -> dict[str, object]:
        self.conn.request("POST", path, json.dumps(body),
                          {"Content-Type": "application/json"})
        r = self.conn.getresponse()
        data = r.read()
        assert r.status == 200, (path, r.status, data[:200])
        out: dict[str, object] = json.loads(data)
        return out

    def tokenize(self, text: str) -> list[int]:
        ids = self._post("/tokenize", {"content": text, "parse_special": True})["tokens"]
        assert isinstance(ids, list)
        return [int(i) for i in ids]

    def detokenize(self, ids: list[int]) -> str:
        return str(self._post("/detokenize", {"tokens": ids})["content"])


@pytest.fixture(scope="module")
def tok(smollm_gguf: Path) -> ChatTokenizer:
    return ChatTokenizer(smollm_gguf)


@pytest.fixture(scope="module")
def server(llama_server: LlamaServerProc) -> Iterator[Server]:
    srv = Server(llama_server.url)
    yield srv
    srv.conn.close()


def test_metadata_matches_the_file(tok: ChatTokenizer) -> None:
    assert tok.vocab_size == 49152
    assert tok.eos_id == 2 and tok.hf.bos_token_id == 1
    assert tok.special["<|im_start|>"] == 1 and tok.special["<|im_end|>"] == 2
    assert len(tok.special) == 17  # the control tokens of the file
    fam = PromptBuilder(tok).family
    assert (fam.close, fam.junction, fam.stop_ids[0]) == ("<|im_end|>", "\n", 2)


def test_corpus_encodes_as_llama_server(tok: ChatTokenizer, server: Server) -> None:
    corpus = build_corpus()
    assert len(corpus) >= 3000
    diffs = []
    for s in corpus:
        ours, theirs = tok.encode(s), server.tokenize(s)
        if ours != theirs:
            diffs.append((s, ours, theirs))
    assert not diffs, f"{len(diffs)} of {len(corpus)} differ, e.g. {diffs[:3]}"


def test_corpus_decodes_as_llama_server(tok: ChatTokenizer, server: Server) -> None:
    corpus = build_corpus(600, seed=7)
    for s in corpus:
        ids = server.tokenize(s)
        assert tok.decode(ids) == server.detokenize(ids), s
    rng = random.Random(3)
    for _ in range(300):
        # Whole-character sequences of any ids (special ones included): what a model can emit.
        ids = [rng.randrange(tok.vocab_size) if rng.random() < 0.9 else rng.randrange(17)
               for _ in range(rng.randint(1, 24))]
        text = server.detokenize(ids)
        if "\ufffd" in text:
            continue  # split UTF-8: each side spells the broken bytes its own way
        assert tok.decode(ids) == text, ids


def test_a_rendered_chat_encodes_as_llama_server(tok: ChatTokenizer, server: Server) -> None:
    builder = PromptBuilder(tok)
    msgs = [{"role": "user", "content": "What is 2+3? Answer in 日本語 🙂"},
            {"role": "assistant", "content": "2+3 = 5\n\n  done"},
            {"role": "user", "content": "and 1234567 * 89?"}]
    r = builder.render_full(msgs)
    assert r.ids == server.tokenize(r.text)
    assert r.text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")


@settings(max_examples=400, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=60)
       | st.lists(st.sampled_from(PIECES), max_size=10).map("".join))
def test_generated_text_encodes_as_llama_server(tok: ChatTokenizer, server: Server,
                                                text: str) -> None:
    assert tok.encode(text) == server.tokenize(text)
