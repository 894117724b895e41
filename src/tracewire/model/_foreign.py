"""Sampling over a foreign vocabulary: any local tokenizer directory, ids with honest logprobs.

The n-gram only knows its own byte-level vocabulary, so a completion over a foreign
tokenizer is drawn in two stages, both recorded in the reported log-probabilities:

1. **Text.** The built-in engine continues ``<|user|>{last 2,048 characters of the decoded
   prompt}<|eot|><|assistant|>`` with plain text (no tool calls), at the request's
   temperature and ``top_p``, until it samples ``<|eot|>`` or runs out of tokens. The
   prompt's trailing headers (segments of at most 16 characters after its last special
   tokens, such as ``assistant\n``) are left out, so the engine sees the last message.
2. **Ids.** The text is tokenized canonically by the foreign tokenizer (special-token
   spellings stay text). With split probability ``p`` (``non_canonical``) each multi-character
   token is independently replaced by the canonical ids of its characters, one by one — a
   deliberately non-canonical tokenization that decodes to the same text. A completion that
   ended on ``<|eot|>`` ends with the stop id (the request's first ``stop_token_ids``, else the
   tokenizer's ``eos_token``).

Each built-in token's log-probability goes to the foreign token holding its last byte (the
``<|eot|>`` one to the stop id); a splittable token adds ``log(1-p)`` when kept, its first
piece ``log p`` when split. So the sum over a completion that ended on its stop id is exactly
the log-probability of that id sequence under this process, and :meth:`ForeignModel.score`
recomputes every value from the ids alone.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from .._errors import ModelError
from ._constraints import DecodeState
from ._engine import Engine, SamplingParams, TokenStep
from ._policy import Policy

__all__ = ["ForeignModel", "ForeignPlan"]

#: Characters of the decoded prompt the built-in engine conditions on.
PROMPT_CHARS = 2048
_EXTRA_HINT = ("serving a tokenizer directory needs the optional extra: "
               "pip install 'tracewire[tito]'")


def _token_name(v: Any) -> str | None:
    if isinstance(v, str):
        return v
    if isinstance(v, dict) and isinstance(v.get("content"), str):
        return str(v["content"])
    return None


@dataclass
class ForeignPlan:
    """A foreign completion before it is sent: ids, their logprobs, and how it ended."""

    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str = "stop"
    text: str = ""


def _from_dir(path: Path) -> tuple[Any, dict[str, Any]]:
    if not (path / "tokenizer.json").is_file():
        raise ModelError(f"{path}: no tokenizer.json (expected a tokenizer directory or a "
                         "GGUF file)")
    try:
        from tokenizers import Tokenizer
    except ImportError as exc:
        raise ModelError(f"{_EXTRA_HINT} ({exc})") from exc
    try:
        tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    except Exception as exc:  # the Rust loader raises its own exception type
        raise ModelError(f"{path}: cannot load tokenizer.json: {exc}") from exc
    config: dict[str, Any] = {}
    cfg_path = path / "tokenizer_config.json"
    if cfg_path.is_file():
        try:
            config = json.loads(cfg_path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ModelError(f"{cfg_path}: unreadable: {exc}") from exc
    return tok, config


def _from_gguf(path: Path) -> tuple[Any, dict[str, Any]]:
    # A GGUF model file: its tokenizer metadata, built the way tracewire.tito builds it.
    from ..tito import TemplateError, TitoUnavailableError, load_gguf

    try:
        g = load_gguf(path)
    except (TemplateError, TitoUnavailableError) as exc:
        raise ModelError(str(exc)) from exc
    return g.tokenizer(), {"eos_token": g.eos_token, "bos_token": g.bos_token,
                           "chat_template": g.chat_template}


class ForeignModel:
    """A local tokenizer directory (``tokenizer.json``, optional ``tokenizer_config.json``)
    or GGUF file, served by the built-in engine through the two-stage sampler in this
    module's docstring."""

    def __init__(self, directory: str | Path, engine: Engine) -> None:
        path = Path(directory)
        config: dict[str, Any] = {}
        if path.is_file():
            self.tok, config = _from_gguf(path)
        else:
            self.tok, config = _from_dir(path)
        # Canonical text tokenization: a "<|im_end|>" the engine writes is text, not a stop.
        self.tok.encode_special_tokens = True
        self.directory = path
        self.config = config
        self.engine = engine
        self.vocab_size = int(self.tok.get_vocab_size(with_added_tokens=True))
        self.special_ids = frozenset(int(i) for i, t in self.tok.get_added_tokens_decoder().items()
                                     if t.special)
        eos = _token_name(config.get("eos_token"))
        eid = self.tok.token_to_id(eos) if eos else None
        self.eos_id: int | None = None if eid is None else int(eid)
        self._splits: dict[int, list[int] | None] = {}
        self._chat: Any = None

    # -- vocabulary -------------------------------------------------------------------------

    def check_ids(self, ids: Sequence[int]) -> None:
        """Raise :class:`ModelError` when an id is outside the vocabulary."""
        for t in ids:
            if not 0 <= int(t) < self.vocab_size:
                raise ModelError(f"token id {t} outside the vocabulary (0..{self.vocab_size - 1})")

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        """Text of ``ids`` (special tokens spelled unless ``skip_special``)."""
        return str(self.tok.decode(list(ids), skip_special_tokens=skip_special))

    def encode_prompt(self, text: str) -> list[int]:
        """Ids of a text prompt, special-token spellings parsed as special tokens."""
        self.tok.encode_special_tokens = False
        try:
            return list(self.tok.encode(text, add_special_tokens=False).ids)
        finally:
            self.tok.encode_special_tokens = True

    def token_text(self, tid: int) -> str:
        """Printable text of one id."""
        return str(self.tok.decode([tid], skip_special_tokens=False))

    def stop_id(self, stop_ids: Sequence[int]) -> int | None:
        """The id a completion that ended on ``<|eot|>`` ends with."""
        return int(stop_ids[0]) if stop_ids else self.eos_id

    def chat_tokenizer(self) -> Any:
        """The directory's chat template, loaded through ``tracewire.tito`` (transformers)."""
        if self._chat is None:
            from ..tito import ChatTokenizer, TemplateError, TitoUnavailableError

            try:
                self._chat = ChatTokenizer(self.directory)
            except (TitoUnavailableError, TemplateError) as exc:
                raise ModelError(str(exc)) from exc
        return self._chat

    def _split(self, tid: int) -> list[int] | None:
        """Canonical ids of ``tid``'s characters one by one, when that is another
        tokenization of the same text (None: the token cannot be split)."""
        if tid in self._splits:
            return self._splits[tid]
        out: list[int] | None = None
        if tid not in self.special_ids:
            text = self.token_text(tid)
            if len(text) > 1 and "\ufffd" not in text:
                pieces = [i for ch in text
                          for i in self.tok.encode(ch, add_special_tokens=False).ids]
                if len(pieces) > 1 and self.decode(pieces) == text:
                    out = [int(i) for i in pieces]
        self._splits[tid] = out
        return out

    # -- the two stages ---------------------------------------------------------------------

    def engine_prompt(self, prompt_ids: Sequence[int]) -> list[int]:
        """Stage 1's built-in prompt for a foreign prompt."""
        e = self.engine
        sp = e.tok.special
        # only the tail is read (bounded cost for long prompts): a token is >= 1 character
        # nearly always, so twice the characters' worth of ids is plenty
        tail = list(prompt_ids[-2 * PROMPT_CHARS:])
        ids = tail
        # Drop the generation prompt's headers ("assistant\n" between special tokens): the
        # engine conditions on its last 32 tokens, which should be the request's words.
        while ids:
            k = len(ids)
            while k and ids[k - 1] not in self.special_ids:
                k -= 1
            if k == 0 or len(self.decode(ids[k:]).strip()) > 16:
                break
            ids = ids[:k - 1]
        text = self.decode(ids or tail, skip_special=True)[-PROMPT_CHARS:]
        return [sp["<|user|>"], *e.tok.encode(text), sp["<|eot|>"], sp["<|assistant|>"]]

    @staticmethod
    def engine_params(params: SamplingParams) -> SamplingParams:
        """Stage 1's sampling: plain text only, no stop strings (stops apply to ids)."""
        return replace(params, tool_choice="none", prefix=(), forced=None, stop=(),
                       tool_names=None, top_logprobs=0)

    def plan(self, text_steps: Sequence[TokenStep], ended: bool, max_tokens: int,
             stop_ids: Sequence[int], split_p: float, rng: np.random.Generator) -> ForeignPlan:
        """Stage 2: the foreign ids (and their logprobs) of stage 1's tokens ``text_steps``
        (content tokens, then ``<|eot|>`` when ``ended``)."""
        e = self.engine
        content = text_steps[:-1] if ended else text_steps
        data = b"".join(e.tok.token_bytes(s.token) for s in content)
        text = data.decode("utf-8", errors="ignore")  # a length cut may end mid-character
        canon, owner_lp = self._canonical(text, content)
        ids: list[int] = []
        lps: list[float] = []
        for tid, lp in zip(canon, owner_lp, strict=True):
            pieces = self._split(tid) if split_p > 0 else None
            if pieces is None:
                ids.append(tid)
                lps.append(lp)
            elif split_p >= 1 or rng.random() < split_p:
                ids.extend(pieces)
                lps.extend([math.log(split_p)] + [0.0] * (len(pieces) - 2) + [lp])
            else:
                ids.append(tid)
                lps.append(lp + math.log1p(-split_p))
        stop = self.stop_id(stop_ids)
        finish = "stop" if ended else "length"
        if ended and stop is not None:
            ids.append(stop)
            lps.append(text_steps[-1].logprob)
        stops = set(stop_ids) | ({stop} if stop is not None else set())
        for k, t in enumerate(ids):
            if t in stops:
                ids, lps, finish = ids[: k + 1], lps[: k + 1], "stop"
                break
        if len(ids) > max_tokens:
            ids, lps, finish = ids[:max_tokens], lps[:max_tokens], "length"
        return ForeignPlan(ids, lps, finish, self.decode([t for t in ids if t not in stops]))

    def _canonical(self, text: str, content: Sequence[TokenStep]) -> tuple[list[int], list[float]]:
        """Canonical foreign ids of ``text`` and the stage-1 logprob each one owns."""
        enc = self.tok.encode(text, add_special_tokens=False)
        ids = [int(i) for i in enc.ids]
        if not ids:
            return [], []
        n_chars = len(text)
        owner = np.full(max(n_chars, 1), -1, dtype=np.int64)
        for k, (a, b) in enumerate(enc.offsets):
            owner[a:b] = k
        # characters a normalizer dropped belong to the token before them (or the first)
        covered = np.maximum.accumulate(owner)
        covered[covered < 0] = 0
        char_of_byte = np.repeat(np.arange(n_chars), [len(c.encode()) for c in text])
        lps = [0.0] * len(ids)
        end = 0
        for s in content:
            end += len(self.engine.tok.token_bytes(s.token))
            at = end - 1
            k = int(covered[char_of_byte[at]]) if at < char_of_byte.size else len(ids) - 1
            lps[k] += s.logprob
        return ids, lps

    def score(self, prompt_ids: Sequence[int], completion: Sequence[int], temperature: float,
              top_p: float, split_p: float = 0.0, stop_ids: Sequence[int] = (),
              policy: Policy | None = None) -> list[float]:
        """Recompute the logprobs reported for ``completion`` (which ended on its stop id)
        from ids alone: stage 1 rescored by the engine, stage 2's split choices read back."""
        e = self.engine
        stop = self.stop_id(stop_ids)
        ended = bool(completion) and completion[-1] == stop
        body = list(completion[:-1] if ended else completion)
        text = self.decode(body)
        bprompt = self.engine_prompt(prompt_ids)
        steps = self._rescore_text(bprompt, e.tok.encode(text) + ([e.tok.eot_id] if ended else []),
                                   temperature, top_p, policy)
        content = steps[:-1] if ended else steps
        canon, owner_lp = self._canonical(text, content)
        out: list[float] = []
        pos = 0
        for tid, lp in zip(canon, owner_lp, strict=True):
            pieces = self._split(tid) if split_p > 0 else None
            if pieces is not None and body[pos:pos + 1] != [tid]:
                if body[pos:pos + len(pieces)] != pieces:
                    raise ModelError(f"completion id {body[pos:pos + 1]} at {pos} is neither "
                                     "the canonical token nor its split")
                out.extend([math.log(split_p)] + [0.0] * (len(pieces) - 2) + [lp])
                pos += len(pieces)
            else:
                out.append(lp if pieces is None else lp + math.log1p(-split_p))
                pos += 1
        if ended:
            out.append(steps[-1].logprob)
        return out

    def _rescore_text(self, bprompt: list[int], bids: list[int], temperature: float,
                      top_p: float, policy: Policy | None) -> list[TokenStep]:
        e = self.engine
        st: DecodeState = e.state_after(bprompt, "none")
        ids = bprompt + bids
        out = []
        for i in range(len(bprompt), len(ids)):
            out.append(e.score_one(ids, i, st, temperature, top_p, 0, policy))
            e.cons.advance(st, ids[i])
        return out
