"""A tokenizer and chat template read from a GGUF model file, built to encode as llama.cpp does.

A GGUF file carries its tokenizer as metadata: ``tokenizer.ggml.tokens`` (the vocabulary,
byte-level spelled for BPE), ``.token_type`` (1 normal, 2 unknown, 3 control, 4
user-defined), ``.merges``, ``.model`` (the algorithm), ``.pre`` (the pre-tokenizer name),
the bos/eos ids and ``tokenizer.chat_template``. They are read with the ``gguf`` package and
built into a Rust ``tokenizers`` object (no torch), with llama.cpp's rules:

- ``model`` ``gpt2`` is byte-level BPE: pieces are mapped to bytes-as-characters, merged by
  rank. Other algorithms (``llama``'s SentencePiece, ...) are refused.
- ``pre`` names a list of regular expressions that llama.cpp applies one after another, each
  splitting every piece so far into its matches and the text between them. ``smollm``
  (and ``starcoder``, ``refact``, ...) first isolates every digit (``\\p{N}``), then splits
  with GPT-2's expression; ``gpt2``-style names use GPT-2's expression alone; ``llama-bpe``
  (Llama 3) and ``qwen2`` use their own single expression (Llama 3 also takes a piece found
  whole in the vocabulary as one token, before any merge).
- Control, unknown and user-defined tokens are matched as whole strings in the raw text
  before any splitting (what ``/tokenize`` does with ``parse_special``). Known gaps, none
  of which SmolLM2's file has: llama.cpp takes special tokens longest first over the whole
  text where ``tokenizers`` takes the leftmost (they differ only when two special tokens'
  texts overlap), and the space-stripping it sets for a few models' tokens by name is not
  reproduced.

Reading the metadata is the slow part (``gguf`` builds a view per array element, ~2 s for a
49k vocabulary), so a tokenizer that took at least :data:`CACHE_MIN_BUILD_S` to build is
cached on disk per file (resolved path, size, mtime) under the tracewire cache directory
(the newest :data:`MAX_CACHED` files kept), and every one in memory per process.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import struct
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from ._errors import TemplateError, TitoUnavailableError

__all__ = ["PRE_TOKENIZERS", "GgufTokenizer", "PreTokenizer", "gguf_cache_dir", "is_gguf",
           "load_gguf"]

_HINT = "reading a GGUF tokenizer needs the optional extra: pip install 'tracewire[tito]'"

#: GPT-2's pre-tokenizer expression, as llama.cpp spells it (contractions, letter runs,
#: digit runs, other-symbol runs, whitespace not followed by non-space, whitespace).
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"

#: Llama 3's: case-insensitive contractions, a letter run with one leading non-letter,
#: digit runs of at most three, symbol runs with trailing newlines, newline runs, spaces.
_LLAMA3 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
           r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
#: Qwen2's: as Llama 3's with every digit on its own.
_QWEN2 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
          r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


@dataclass(frozen=True, slots=True)
class PreTokenizer:
    """How llama.cpp pre-tokenizes for one ``tokenizer.ggml.pre``: the expressions it splits
    with, in order, and whether a piece found whole in the vocabulary skips the merges."""

    exprs: tuple[str, ...]
    ignore_merges: bool = False


#: ``tokenizer.ggml.pre`` -> its pre-tokenizer (read off llama.cpp's vocabulary loader;
#: only these groups are supported, each checked against llama.cpp's tokenizer test
#: vocabularies).
PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    **{name: PreTokenizer((r"\p{N}", _GPT2)) for name in (
        "smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva")},
    **{name: PreTokenizer((_GPT2,)) for name in (
        "gpt-2", "gpt2", "phi-2", "jina-es", "jina-de", "jina-v2-es", "jina-v2-de", "mpt",
        "olmo", "jais")},
    **{name: PreTokenizer((_LLAMA3,), ignore_merges=True) for name in (
        "llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral")},
    **{name: PreTokenizer((_QWEN2,)) for name in ("qwen2", "deepseek-r1-qwen")},
}

#: Bump when the built form changes, so old cache files are not reused.
_CACHE_VERSION = 2
#: Builds faster than this are not written to the disk cache.
CACHE_MIN_BUILD_S = 0.25
#: Cache files kept (the newest); older ones are removed when a new one is written.
MAX_CACHED = 16

_TOKEN_NORMAL, _TOKEN_UNKNOWN, _TOKEN_CONTROL, _TOKEN_USER = 1, 2, 3, 4

_memo: dict[tuple[str, int, int], GgufTokenizer] = {}
_memo_lock = threading.Lock()


def is_gguf(path: str | Path) -> bool:
    """Whether ``path`` is a GGUF file (by its magic bytes, not its name)."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


def gguf_cache_dir() -> Path:
    """Where built GGUF tokenizers are cached: ``$TRACEWIRE_CACHE/tokenizers``, else the
    user's cache directory's ``tracewire/tokenizers``."""
    root = os.environ.get("TRACEWIRE_CACHE")
    if not root:
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        root = str(Path(base) / "tracewire")
    return Path(root) / "tokenizers"


@dataclass(frozen=True, slots=True)
class GgufTokenizer:
    """A GGUF file's tokenizer, built: ``tokenizer_json`` (the ``tokenizers`` serialization),
    the special tokens' text, bos/eos text, the chat template and where it came from."""

    path: Path
    tokenizer_json: str
    vocab_size: int
    bos_token: str | None
    eos_token: str | None
    add_bos: bool
    chat_template: str | None
    pre: str
    special: tuple[str, ...]

    def tokenizer(self) -> Any:
        """A fresh Rust ``tokenizers.Tokenizer`` for this file."""
        from tokenizers import Tokenizer

        return Tokenizer.from_str(self.tokenizer_json)


def _field(fields: dict[str, Any], key: str, default: Any = None) -> Any:
    f = fields.get(key)
    if f is None:
        return default
    v = f.contents()
    return default if v is None else v


def _read(path: Path) -> dict[str, Any]:
    try:
        import gguf
    except ImportError as exc:
        raise TitoUnavailableError(f"{_HINT} ({exc})") from exc
    try:
        reader = gguf.GGUFReader(str(path), "r")
    except (OSError, ValueError, KeyError, IndexError, TypeError, EOFError,
            struct.error) as exc:  # a damaged file fails deep inside gguf's parser
        raise TemplateError(f"{path}: not a readable GGUF file: {exc}") from exc
    f = reader.fields
    meta = {
        "model": _field(f, "tokenizer.ggml.model"),
        "pre": _field(f, "tokenizer.ggml.pre", "default"),
        "tokens": _field(f, "tokenizer.ggml.tokens"),
        "types": _field(f, "tokenizer.ggml.token_type"),
        "merges": _field(f, "tokenizer.ggml.merges"),
        "bos": _field(f, "tokenizer.ggml.bos_token_id"),
        "eos": _field(f, "tokenizer.ggml.eos_token_id"),
        "add_bos": _field(f, "tokenizer.ggml.add_bos_token", False),
        "template": _field(f, "tokenizer.chat_template"),
    }
    del reader  # drop the memory map before the caller reuses the file
    return meta


def _build(path: Path) -> GgufTokenizer:
    meta = _read(path)
    if meta["tokens"] is None:
        raise TemplateError(f"{path}: the GGUF file carries no tokenizer (no "
                            "tokenizer.ggml.tokens)")
    if meta["model"] != "gpt2":
        raise TemplateError(f"{path}: tokenizer.ggml.model {meta['model']!r} is not supported "
                            "(only byte-level BPE, 'gpt2')")
    pre = str(meta["pre"])
    spec = PRE_TOKENIZERS.get(pre)
    if spec is None:
        raise TemplateError(f"{path}: tokenizer.ggml.pre {pre!r} is not supported (supported: "
                            f"{', '.join(sorted(PRE_TOKENIZERS))})")
    try:
        from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    except ImportError as exc:
        raise TitoUnavailableError(f"{_HINT} ({exc})") from exc
    tokens = [str(t) for t in meta["tokens"]]
    types = [int(t) for t in meta["types"]] if meta["types"] is not None else []
    if types and len(types) != len(tokens):
        raise TemplateError(f"{path}: token_type has {len(types)} entries for "
                            f"{len(tokens)} tokens")
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)  # a duplicate spelling keeps its first id, as a dict must
    merges = []
    for m in meta["merges"] or ():
        a, sep, b = str(m).partition(" ")
        if not sep:
            raise TemplateError(f"{path}: malformed merge {m!r}")
        merges.append((a, b))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False,
                               byte_fallback=False, ignore_merges=spec.ignore_merges))
    # Each expression splits every piece so far, matches and gaps both kept: llama.cpp's
    # sequential regex split. ByteLevel then only maps bytes (its own regex off).
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(e), behavior="isolated") for e in spec.exprs]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    special = [t for t, k in zip(tokens, types, strict=False)
               if k in (_TOKEN_CONTROL, _TOKEN_UNKNOWN)]
    user = [t for t, k in zip(tokens, types, strict=False) if k == _TOKEN_USER]
    # Matched in the raw text, before any split, never normalized or stripped of spaces.
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in user])

    def text_of(key: str) -> str | None:
        v = meta[key]
        if v is None:
            return None
        i = int(v)
        return tokens[i] if 0 <= i < len(tokens) else None

    template = meta["template"]
    return GgufTokenizer(path=path, tokenizer_json=tok.to_str(), vocab_size=len(tokens),
                         bos_token=text_of("bos"), eos_token=text_of("eos"),
                         add_bos=bool(meta["add_bos"]),
                         chat_template=str(template) if template else None, pre=pre,
                         special=tuple(special))


def _cache_file(path: Path, st: os.stat_result) -> Path:
    key = orjson.dumps([_CACHE_VERSION, str(path), st.st_size, st.st_mtime_ns])
    return gguf_cache_dir() / f"gguf-{hashlib.blake2b(key, digest_size=12).hexdigest()}.json"


def _load_cached(cache: Path, path: Path) -> GgufTokenizer | None:
    try:
        d = orjson.loads(cache.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    try:
        return GgufTokenizer(path=path, tokenizer_json=d["tokenizer_json"],
                             vocab_size=int(d["vocab_size"]), bos_token=d["bos_token"],
                             eos_token=d["eos_token"], add_bos=bool(d["add_bos"]),
                             chat_template=d["chat_template"], pre=str(d["pre"]),
                             special=tuple(d["special"]))
    except (KeyError, TypeError, ValueError):
        return None


def _store(cache: Path, built: GgufTokenizer) -> None:
    d = {"tokenizer_json": built.tokenizer_json, "vocab_size": built.vocab_size,
         "bos_token": built.bos_token, "eos_token": built.eos_token, "add_bos": built.add_bos,
         "chat_template": built.chat_template, "pre": built.pre,
         "special": list(built.special)}
    # A cache that cannot be written only costs the next load its time.
    with contextlib.suppress(OSError):
        cache.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cache.parent, prefix=".gguf-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(orjson.dumps(d))
            os.replace(tmp, cache)  # atomic: a concurrent loader reads old or new, whole
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def _prune(directory: Path) -> None:
    """Keep the newest MAX_CACHED cache files (one per GGUF file and version seen)."""
    with contextlib.suppress(OSError):
        files = sorted(directory.glob("gguf-*.json"), key=lambda f: f.stat().st_mtime,
                       reverse=True)
        for old in files[MAX_CACHED:]:
            with contextlib.suppress(OSError):
                old.unlink()


def load_gguf(path: str | Path, *, use_cache: bool = True) -> GgufTokenizer:
    """The tokenizer of the GGUF file ``path`` (see module docstring);
    :class:`TemplateError` for a file that is not GGUF or whose tokenizer is unsupported."""
    p = Path(path).resolve()
    try:
        st = p.stat()
    except OSError as exc:
        raise TemplateError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    key = (str(p), st.st_size, st.st_mtime_ns)
    with _memo_lock:
        hit = _memo.get(key)
    if hit is not None:
        return hit
    if not is_gguf(p):
        raise TemplateError(f"{path}: not a GGUF file (no GGUF magic)")
    cache = _cache_file(p, st)
    built = _load_cached(cache, p) if use_cache else None
    if built is None:
        t0 = time.perf_counter()
        built = _build(p)
        # Only a slow build is worth a file (a small vocabulary builds in milliseconds:
        # tests' fixture files would otherwise pile up in the user's cache).
        if use_cache and time.perf_counter() - t0 >= CACHE_MIN_BUILD_S:
            _store(cache, built)
            _prune(cache.parent)
    with _memo_lock:
        _memo[key] = built
    return built
