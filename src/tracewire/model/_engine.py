"""Sampling and scoring: the n-gram model + constraints -> tokens with honest logprobs.

The distribution a token is drawn from is: the model's next-token probabilities, restricted
to the allowed tokens (:mod:`._constraints`), raised to ``1/temperature``, renormalized, then
cut to the ``top_p`` nucleus and renormalized again. Its log-probability for the chosen token
is what gets reported. Greedy decoding (temperature 0) is a deterministic choice, not a
distribution; it reports the temperature-1 (constrained) log-probabilities instead, and so
does scoring at temperature 0.
"""

from __future__ import annotations

import codecs
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from ._constraints import Constraints, DecodeState
from ._ngram import NgramModel, load_model
from ._policy import Policy, nucleus, softmax_scores
from ._tokenizer import Tokenizer, load_tokenizer

__all__ = ["Engine", "Generation", "SamplingParams", "TokenStep", "get_engine"]

#: Log-probabilities below this (or -inf) are reported as this, as vLLM does.
LOGPROB_FLOOR = -9999.0
_F64 = npt.NDArray[np.float64]


@dataclass
class SamplingParams:
    """What one choice is generated with."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    top_logprobs: int = 0
    tool_choice: str = "auto"  # auto | none | required | one
    prefix: tuple[int, ...] = ()  # ids forced before sampling starts (named tool_choice)
    forced: tuple[int, ...] | None = None  # the whole completion, forced (tests only)
    stop_in_calls: bool = True  # completions: stop strings see special-token spellings
    tool_names: tuple[str, ...] | None = None  # declared tools (None: any name may be called)


@dataclass
class TokenStep:
    """One generated token with its reported log-probability and alternatives."""

    token: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


def _clamp(x: float) -> float:
    return x if x > LOGPROB_FLOOR else LOGPROB_FLOOR


class Engine:
    """The model, tokenizer and constraints of one process (shared by every server)."""

    def __init__(self, tok: Tokenizer, model: NgramModel) -> None:
        self.tok = tok
        self.model = model
        self.cons = Constraints(tok)
        specials = set(self.cons.headers) | {self.cons.eot}
        self._anchor_ids = np.array(sorted(specials), dtype=np.int64)

    # -- distributions ----------------------------------------------------------------------

    def distribution(
        self, context: Sequence[int], st: DecodeState, temperature: float, top_p: float,
        policy: Policy | None = None,
    ) -> _F64:
        """The normalized distribution actually used for the token after ``context``.

        With a trainable ``policy`` the scores are log-linear (:mod:`._policy`); without
        one, the n-gram's probabilities are used as they are.
        """
        ctx = context[-self.model.max_order :]
        p = self.model.probs(ctx)
        allowed = self.cons.allowed(st)
        if policy is not None:
            sq = softmax_scores(np.log(p) + policy.offset(ctx), allowed,
                                temperature if temperature > 0 else 1.0)
            if sq is None:
                return self._point_mass(p, allowed)
            q = sq
        else:
            q = np.where(allowed, p, 0.0)
            if temperature > 0 and temperature != 1.0:
                q = np.power(q, 1.0 / temperature)
            total = q.sum()
            if not total > 0 or not math.isfinite(total):
                # extreme temperatures underflow/overflow: fall back to the argmax point mass
                return self._point_mass(p, allowed)
            q /= total
        if temperature > 0 and top_p < 1.0:
            q = nucleus(q, top_p)
        return q

    @staticmethod
    def _point_mass(p: _F64, allowed: npt.NDArray[np.bool_]) -> _F64:
        q = np.zeros_like(p)
        q[int(np.argmax(np.where(allowed, p, -1.0)))] = 1.0
        return q

    def logprob_grad(
        self, context: Sequence[int], st: DecodeState, token: int, temperature: float,
        top_p: float, policy: Policy,
    ) -> tuple[float, _F64]:
        """Reported log-probability of ``token`` under ``policy`` and its gradient with respect
        to the scores (``(onehot - q) / T``; the weights' gradient is this, added to ``bias``,
        to ``pair[context[-1]]`` and to each row of ``Policy.context_keys(context)``). A point
        mass (no choice) has gradient 0."""
        q = self.distribution(context, st, temperature, top_p, policy)
        with np.errstate(divide="ignore"):
            lp = _clamp(float(np.log(q[token])))
        if q[token] >= 1.0 or q[token] <= 0.0:
            return lp, np.zeros_like(q)
        g = -q
        g[token] += 1.0
        t = temperature if temperature > 0 else 1.0
        if t != 1.0:
            g /= t
        return lp, g

    def name_ids(self, tool_names: Sequence[str] | None) -> tuple[tuple[int, ...], ...] | None:
        """Canonical ids of the non-empty ``tool_names`` (None when none constrain)."""
        if tool_names is None:
            return None
        out = tuple(sorted({tuple(self.tok.encode(n)) for n in tool_names if n}))
        return out or None

    def state_after(
        self, ids: Sequence[int], tool_choice: str = "auto",
        tool_names: Sequence[str] | None = None,
    ) -> DecodeState:
        """The decode state after ``ids``, replaying only from the last header or end-of-turn."""
        st = DecodeState(tool_choice=tool_choice, names=self.name_ids(tool_names))
        arr = np.asarray(ids, dtype=np.int64)
        hits = np.flatnonzero(np.isin(arr, self._anchor_ids))
        start = int(hits[-1]) if hits.size else 0
        for t in ids[start:]:
            self.cons.advance(st, int(t))
        return st

    def top(self, q: _F64, k: int) -> list[tuple[int, float]]:
        """The ``k`` most likely tokens of ``q`` with clamped log-probabilities."""
        if k <= 0:
            return []
        idx = np.argpartition(-q, k - 1)[:k] if k < q.size else np.arange(q.size)
        idx = idx[np.lexsort((idx, -q[idx]))]
        with np.errstate(divide="ignore"):
            return [(int(i), _clamp(float(np.log(q[i])))) for i in idx]

    def score(
        self, ids: Sequence[int], temperature: float, top_p: float, top_k: int = 0,
        policy: Policy | None = None,
    ) -> list[TokenStep | None]:
        """Reported log-probability of every id given the ones before it (first: None)."""
        out: list[TokenStep | None] = [None] if ids else []
        st = DecodeState()
        if ids:
            self.cons.advance(st, int(ids[0]))
        for i in range(1, len(ids)):
            out.append(self.score_one(ids, i, st, temperature, top_p, top_k, policy))
            self.cons.advance(st, int(ids[i]))
        return out

    def score_one(
        self, ids: Sequence[int], i: int, st: DecodeState, temperature: float, top_p: float,
        top_k: int, policy: Policy | None = None,
    ) -> TokenStep:
        """Score ``ids[i]`` given ``ids[:i]`` whose state is ``st``."""
        q = self.distribution(ids[max(0, i - self.model.max_order) : i], st, temperature, top_p,
                              policy)
        t = int(ids[i])
        with np.errstate(divide="ignore"):
            lp = _clamp(float(np.log(q[t])))
        return TokenStep(t, lp, self.top(q, top_k))


class Generation:
    """One choice being generated; call :meth:`step` until :attr:`finish_reason` is set."""

    def __init__(
        self, engine: Engine, prompt: Sequence[int], params: SamplingParams,
        rng: np.random.Generator, policy: Policy | None = None,
    ) -> None:
        self.e = engine
        self.p = params
        self.rng = rng
        self.policy = policy  # kept for the whole generation, even if a new one is swapped in
        self.state = engine.state_after(prompt, params.tool_choice, params.tool_names)
        self.context: list[int] = [int(t) for t in prompt[-engine.model.max_order :]]
        self.tokens: list[int] = []
        self.finish_reason: str | None = None
        self._text = ""
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stop_len = max((len(s) for s in params.stop), default=0)
        self._stopped_at: int | None = None

    @property
    def stop_cut(self) -> int | None:
        """Length of the visible text before a matched stop string, if one matched."""
        return self._stopped_at

    def step(self) -> TokenStep | None:
        """Generate one token (None once finished)."""
        if self.finish_reason is not None:
            return None
        n = len(self.tokens)
        p = self.p
        if n >= p.max_tokens:
            self.finish_reason = "length"
            return None
        if p.forced is not None:
            if n >= len(p.forced):
                self.finish_reason = "stop"
                return None
            temp = p.temperature if p.temperature > 0 else 1.0
            q = self.e.distribution(self.context, self.state, temp, 1.0, self.policy)
            t = p.forced[n]
        elif n < len(p.prefix):
            q = np.zeros(self.e.tok.vocab_size)
            q[p.prefix[n]] = 1.0
            t = p.prefix[n]
        else:
            q = self.e.distribution(self.context, self.state, p.temperature, p.top_p,
                                    self.policy)
            if p.temperature <= 0:
                t = int(np.argmax(q))
            else:
                cs = np.cumsum(q)
                t = int(np.searchsorted(cs, self.rng.random() * cs[-1], side="right"))
                t = min(t, q.size - 1)
                if q[t] <= 0:  # rounding at the very end of the cumulative sum
                    t = int(np.flatnonzero(q)[-1])
        with np.errstate(divide="ignore"):
            step = TokenStep(t, _clamp(float(np.log(q[t]))), self.e.top(q, p.top_logprobs))
        self._push(t)
        return step

    def _push(self, t: int) -> None:
        e = self.e
        in_content = self.state.role != "assistant" or self.state.gstate == 0
        self.tokens.append(t)
        self.context.append(t)
        if len(self.context) > e.model.max_order:
            del self.context[0]
        e.cons.advance(self.state, t)
        if t == e.cons.eot:
            self.finish_reason = "stop"
            return
        if self._stop_len and (self.p.stop_in_calls or (in_content and not e.tok.is_special(t))):
            old = len(self._text)
            self._text += self._decoder.decode(e.tok.token_bytes(t))
            window = self._text[max(0, old - self._stop_len) :]
            base = max(0, old - self._stop_len)
            hits = [window.find(s) for s in self.p.stop]
            found = [h for h in hits if h >= 0]
            if found:
                self._stopped_at = base + min(found)
                self.finish_reason = "stop"
        if len(self.tokens) >= self.p.max_tokens and self.finish_reason is None:
            self.finish_reason = "length"


_ENGINE: list[Engine] = []


def get_engine() -> Engine:
    """The process-wide engine (tokenizer + model + constraint caches), built on first use."""
    if not _ENGINE:
        tok = load_tokenizer()
        _ENGINE.append(Engine(tok, load_model(tok.vocab_size)))
    return _ENGINE[0]
