"""Byte-level tokenizer with a trained word vocabulary and greedy longest-match encoding.

Ids 0..255 are the single bytes, then the trained multi-byte (ASCII-only) pieces, then the
special tokens. Encoding takes the longest vocabulary piece at each position, so every byte
string has exactly one canonical tokenization and ``decode(encode(s)) == s`` for any ``s``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from importlib import resources
from typing import Any

from .._errors import ModelError

__all__ = ["SPECIAL_TOKENS", "Tokenizer", "load_tokenizer"]

#: The special tokens, in id order after the byte-level vocabulary.
SPECIAL_TOKENS: tuple[str, ...] = (
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|tool|>",
    "<|eot|>",
    "<|call|>",
    "<|args|>",
    "<|endcall|>",
)

#: Longest multi-byte piece the vocabulary may hold (bounds the canonicality check).
MAX_PIECE_BYTES = 16

_Node = dict[int, "list[Any]"]  # byte -> [token id or -1, child node]


class Tokenizer:
    """Greedy longest-match byte tokenizer; special tokens are only parsed where asked."""

    def __init__(self, pieces: Sequence[str]) -> None:
        self.pieces: list[bytes] = [bytes([b]) for b in range(256)]
        for piece in pieces:
            data = piece.encode("ascii")
            if not 2 <= len(data) <= MAX_PIECE_BYTES:
                raise ModelError(f"vocabulary piece of bad length: {piece!r}")
            self.pieces.append(data)
        if len(set(self.pieces)) != len(self.pieces):
            raise ModelError("duplicate vocabulary piece")
        self.n_bytes_tokens = len(self.pieces)
        self.special: dict[str, int] = {
            s: self.n_bytes_tokens + i for i, s in enumerate(SPECIAL_TOKENS)
        }
        self.vocab_size = self.n_bytes_tokens + len(SPECIAL_TOKENS)
        self.eot_id = self.special["<|eot|>"]
        self._root: _Node = {}
        for tid, data in enumerate(self.pieces):
            node = self._root
            for i, b in enumerate(data):
                entry = node.get(b)
                if entry is None:
                    entry = [-1, {}]
                    node[b] = entry
                if i == len(data) - 1:
                    entry[0] = tid
                node = entry[1]
        self._token_bytes: list[bytes] = self.pieces + [s.encode() for s in SPECIAL_TOKENS]

    # -- encoding ---------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Canonical ids of ``text``; special-token spellings are encoded as plain bytes."""
        return self.encode_bytes(text.encode("utf-8"))

    def encode_bytes(self, data: bytes) -> list[int]:
        """Canonical ids of a byte string."""
        out: list[int] = []
        pos = 0
        while pos < len(data):
            pos = self.encode_some(data, pos, len(data), out)
        return out

    def encode_some(self, data: bytes, pos: int, limit: int, out: list[int]) -> int:
        """Encode from ``pos`` until at least ``limit``; returns the new position (resumable)."""
        n = len(data)
        root = self._root
        while pos < n and pos < limit:
            best = data[pos]
            best_end = pos + 1
            node = root
            j = pos
            while j < n:
                entry = node.get(data[j])
                if entry is None:
                    break
                j += 1
                if entry[0] >= 0:
                    best = entry[0]
                    best_end = j
                node = entry[1]
            out.append(best)
            pos = best_end
        return pos

    def encode_with_special(self, text: str) -> list[int]:
        """Like :meth:`encode` but special-token spellings become their ids (completions)."""
        out: list[int] = []
        rest = text
        while rest:
            cut, which = len(rest), ""
            for s in SPECIAL_TOKENS:
                i = rest.find(s)
                if 0 <= i < cut:
                    cut, which = i, s
            out.extend(self.encode(rest[:cut]))
            if not which:
                break
            out.append(self.special[which])
            rest = rest[cut + len(which) :]
        return out

    # -- decoding ---------------------------------------------------------------------------

    def token_bytes(self, tid: int) -> bytes:
        """Bytes of one token (special tokens give their spelling)."""
        return self._token_bytes[tid]

    def token_text(self, tid: int) -> str:
        """Printable text of one token; partial UTF-8 shows as U+FFFD."""
        return self._token_bytes[tid].decode("utf-8", errors="replace")

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids``; special tokens appear as their spellings."""
        self.check_ids(ids)
        return b"".join(self._token_bytes[int(t)] for t in ids).decode("utf-8", errors="replace")

    def is_special(self, tid: int) -> bool:
        """Whether ``tid`` is one of :data:`SPECIAL_TOKENS`."""
        return tid >= self.n_bytes_tokens

    def check_ids(self, ids: Iterable[int]) -> None:
        """Raise :class:`ModelError` when an id is outside the vocabulary."""
        for t in ids:
            if not 0 <= int(t) < self.vocab_size:
                raise ModelError(f"token id {t} outside the vocabulary (0..{self.vocab_size - 1})")

    def to_json(self) -> str:
        """Serialized form (the multi-byte pieces; bytes and specials are implied)."""
        pieces = [p.decode("ascii") for p in self.pieces[256:]]
        return json.dumps({"version": 1, "special": list(SPECIAL_TOKENS), "pieces": pieces})


_CACHE: list[Tokenizer] = []


def load_tokenizer() -> Tokenizer:
    """The tokenizer shipped in the package (loaded once per process)."""
    if not _CACHE:
        raw = resources.files("tracewire.model").joinpath("assets/tokenizer.json").read_text()
        obj = json.loads(raw)
        if tuple(obj["special"]) != SPECIAL_TOKENS:
            raise ModelError("tokenizer.json special tokens do not match this build")
        _CACHE.append(Tokenizer(obj["pieces"]))
    return _CACHE[0]
