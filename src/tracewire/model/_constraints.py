"""Which tokens may come next: turn grammar, valid UTF-8, and canonical tokenization.

Sampling is restricted to tokens that keep (1) the chat grammar (roles, tool-call blocks),
(2) each text segment valid UTF-8 at every special token, and (3) the ids the canonical
(greedy longest-match) tokenization of their own text. (3) is what makes a generated turn
re-render to exactly the sampled ids. (4) When the request declared tools, a tool call's
name is one of their canonical id sequences (a trie walk), so the model cannot call a tool
the request never offered. The restricted, renormalized distribution is the one
sampled from and the one whose log-probabilities are reported.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from ._tokenizer import MAX_PIECE_BYTES, Tokenizer

__all__ = ["Constraints", "DecodeState"]

_B = npt.NDArray[np.bool_]

# grammar states inside an assistant turn
CONTENT, NAME, ARGS, AFTER_CALL = 0, 1, 2, 3


@dataclass
class DecodeState:
    """Where we are in the token stream; updated one id at a time by :meth:`Constraints.advance`."""

    role: str | None = None  # role of the open turn (None: before any / between turns)
    after_eot: bool = False
    gstate: int = CONTENT
    calls: int = 0
    seg_bytes: int = 0  # bytes in the current text segment (since the last special token)
    tail: list[int] = field(default_factory=list)  # last ids of the segment (<= 16)
    need: int = 0  # UTF-8 continuation bytes still expected
    lo: int = 0x80
    hi: int = 0xBF
    # request-level tool_choice: "auto", "none", "required", or "one" (a single named call)
    tool_choice: str = "auto"
    # canonical ids of the declared tool names (None: any name)
    names: tuple[tuple[int, ...], ...] | None = None
    name_ids: list[int] = field(default_factory=list)  # ids of the call name so far

    def copy(self) -> DecodeState:
        """An independent copy."""
        return DecodeState(self.role, self.after_eot, self.gstate, self.calls, self.seg_bytes,
                           list(self.tail), self.need, self.lo, self.hi, self.tool_choice,
                           self.names, list(self.name_ids))


class Constraints:
    """Allowed-next-token masks for a :class:`DecodeState`, with caches."""

    def __init__(self, tok: Tokenizer) -> None:
        self.tok = tok
        v = tok.vocab_size
        sp = tok.special
        self.headers = {sp["<|system|>"]: "system", sp["<|user|>"]: "user",
                        sp["<|assistant|>"]: "assistant", sp["<|tool|>"]: "tool"}
        self.eot, self.call = sp["<|eot|>"], sp["<|call|>"]
        self.args, self.endcall = sp["<|args|>"], sp["<|endcall|>"]
        lead = np.zeros(v, dtype=bool)
        lead[256 : tok.n_bytes_tokens] = True  # ASCII pieces are complete text
        lead[0:0x80] = True
        lead[0xC2:0xF5] = True
        self.text_start: _B = lead  # tokens allowed when no continuation byte is pending
        pieces = tok.pieces
        self._sorted = sorted(range(tok.n_bytes_tokens), key=lambda i: pieces[i])
        self._sorted_bytes = [pieces[i] for i in self._sorted]
        self._prefixes: set[bytes] = set()
        for p in pieces[256:]:
            for k in range(1, len(p)):
                self._prefixes.add(p[:k])
        self._forbid: dict[bytes, _B] = {}
        self._masks: dict[tuple[object, ...], _B] = {}

    # -- state updates ----------------------------------------------------------------------

    def advance(self, st: DecodeState, t: int) -> None:
        """Move ``st`` past token ``t``."""
        if self.tok.is_special(t):
            st.seg_bytes, st.need = 0, 0
            st.tail.clear()
            if t in self.headers:
                st.role, st.after_eot, st.gstate, st.calls = self.headers[t], False, CONTENT, 0
            elif t == self.eot:
                st.role, st.after_eot = None, True
            elif st.role == "assistant":
                if t == self.call:
                    st.gstate = NAME
                    st.name_ids.clear()
                elif t == self.args:
                    st.gstate = ARGS
                elif t == self.endcall:
                    st.gstate, st.calls = AFTER_CALL, st.calls + 1
            return
        data = self.tok.token_bytes(t)
        if st.gstate == NAME and st.role == "assistant":
            st.name_ids.append(t)
        st.seg_bytes += len(data)
        st.tail.append(t)
        if len(st.tail) > MAX_PIECE_BYTES:
            del st.tail[0]
        if t >= 256:
            st.need = 0
            return
        b = data[0]
        if st.need and st.lo <= b <= st.hi:
            st.need -= 1
            st.lo, st.hi = 0x80, 0xBF
        elif 0xC2 <= b <= 0xDF:
            st.need, st.lo, st.hi = 1, 0x80, 0xBF
        elif 0xE0 <= b <= 0xEF:
            st.need = 2
            st.lo, st.hi = (0xA0 if b == 0xE0 else 0x80), (0x9F if b == 0xED else 0xBF)
        elif 0xF0 <= b <= 0xF4:
            st.need = 3
            st.lo, st.hi = (0x90 if b == 0xF0 else 0x80), (0x8F if b == 0xF4 else 0xBF)
        else:
            st.need = 0  # ASCII, or an invalid byte given in a prompt: resynchronize

    # -- masks ------------------------------------------------------------------------------

    def allowed(self, st: DecodeState) -> _B:
        """Boolean mask over the vocabulary of tokens allowed after ``st`` (do not mutate)."""
        if st.names is not None and st.gstate == NAME and st.role == "assistant":
            return self._name_mask(st.names, tuple(st.name_ids))
        if st.need:
            key: tuple[object, ...] = ("cont", st.lo, st.hi)
            mask = self._masks.get(key)
            if mask is None:
                mask = np.zeros(self.tok.vocab_size, dtype=bool)
                mask[st.lo : st.hi + 1] = True
                self._masks[key] = mask
            return mask
        specials = self._specials(st)
        text_ok = specials[1]
        suffixes = self._live_suffixes(st) if text_ok else ()
        key = (specials, suffixes)
        mask = self._masks.get(key)
        if mask is None:
            mask = self.text_start.copy() if text_ok else np.zeros(self.tok.vocab_size, bool)
            for u in suffixes:
                mask &= ~self._forbidden(u)
            for t in specials[0]:
                mask[t] = True
            if len(self._masks) > 20000:
                self._masks.clear()  # bound memory; entries are cheap to rebuild
            self._masks[key] = mask
        return mask

    def _name_mask(self, names: tuple[tuple[int, ...], ...], so_far: tuple[int, ...]) -> _B:
        """Next ids that keep the call name on a declared name's canonical ids (or end it)."""
        key: tuple[object, ...] = ("name", names, so_far)
        mask = self._masks.get(key)
        if mask is None:
            mask = np.zeros(self.tok.vocab_size, dtype=bool)
            n = len(so_far)
            for ids in names:
                if ids[:n] == so_far:
                    if len(ids) > n:
                        mask[ids[n]] = True
                    elif n:
                        mask[self.args] = True
            if len(self._masks) > 20000:
                self._masks.clear()
            self._masks[key] = mask
        return mask

    def _specials(self, st: DecodeState) -> tuple[tuple[int, ...], bool]:
        """(allowed special ids, whether text tokens are allowed)."""
        if st.role is None:
            if st.after_eot:
                return tuple(self.headers), False
            return (self.eot,), True
        if st.role != "assistant":
            return (self.eot,), True
        tc = st.tool_choice
        if st.gstate == CONTENT:
            out: list[int] = []
            if tc != "none":
                out.append(self.call)
            if tc == "auto" or tc == "none" or st.calls:
                out.append(self.eot)
            return tuple(out), True
        if st.gstate == NAME:
            return ((self.args,) if st.seg_bytes else ()), True
        if st.gstate == ARGS:
            return (self.endcall,), True
        if tc == "one":
            return (self.eot,), False
        return ((self.call, self.eot) if tc != "none" else (self.eot,)), False

    def _live_suffixes(self, st: DecodeState) -> tuple[bytes, ...]:
        """Token-aligned suffixes of the segment that some vocabulary piece extends."""
        out: list[bytes] = []
        acc = b""
        for t in reversed(st.tail):
            acc = self.tok.token_bytes(t) + acc
            if len(acc) >= MAX_PIECE_BYTES:
                break
            if acc in self._prefixes:
                out.append(acc)
        return tuple(out)

    def _forbidden(self, u: bytes) -> _B:
        """Tokens whose text would merge with suffix ``u`` into a longer vocabulary piece."""
        mask = self._forbid.get(u)
        if mask is not None:
            return mask
        mask = np.zeros(self.tok.vocab_size, dtype=bool)
        sb = self._sorted_bytes
        i = bisect_left(sb, u)
        while i < len(sb) and sb[i].startswith(u):
            w = sb[i]
            i += 1
            if len(w) == len(u):
                continue
            v = w[len(u) :]
            lo = bisect_left(sb, v)
            hi = lo
            while hi < len(sb) and sb[hi].startswith(v):
                hi += 1
            mask[[self._sorted[j] for j in range(lo, hi)]] = True
        if len(self._forbid) > 20000:
            self._forbid.clear()
        self._forbid[u] = mask
        return mask
