"""One completion over token ids, from the built-in vocabulary or a foreign one.

Every token-in endpoint (``/v1/completions`` by ids, ``/inference/v1/generate``, SGLang
``/generate``) asks a :class:`Run` for its steps; the run hides which vocabulary samples.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .._errors import ModelError
from ._chat import Shared, drive, rng_for
from ._engine import Generation, SamplingParams, TokenStep
from ._policy import Policy
from ._protocol import RequestError

__all__ = [
    "IdRequest",
    "Run",
    "TextTail",
    "check_prompt_ids",
    "drive_stops",
    "split_probability",
    "stop_token_ids",
    "vocab_size",
    "with_last",
]

#: Most ``stop_token_ids`` a request may give.
MAX_STOP_IDS = 64


def _is_id(t: Any) -> bool:
    return isinstance(t, int) and not isinstance(t, bool)


def vocab_size(shared: Shared) -> int:
    """Size of the vocabulary this server samples over."""
    return shared.foreign.vocab_size if shared.foreign is not None else shared.engine.tok.vocab_size


def check_prompt_ids(shared: Shared, raw: Any, param: str) -> list[int]:
    """A non-empty list of in-vocabulary ids, else a 400 naming ``param``."""
    if not isinstance(raw, list) or not raw or not all(_is_id(t) for t in raw):
        raise RequestError(f"'{param}' must be a non-empty list of token ids", param)
    n = vocab_size(shared)
    bad = next((t for t in raw if not 0 <= t < n), None)
    if bad is not None:
        raise RequestError(f"token id {bad} outside the vocabulary (0..{n - 1})", param)
    return [int(t) for t in raw]


def stop_token_ids(shared: Shared, body: Mapping[str, Any], param: str) -> tuple[int, ...]:
    """``stop_token_ids`` (ids that end a completion, kept in it), checked."""
    raw = body.get("stop_token_ids")
    if raw is None:
        return ()
    if not isinstance(raw, list) or len(raw) > MAX_STOP_IDS or not all(_is_id(t) for t in raw):
        raise RequestError(f"'stop_token_ids' must be a list of at most {MAX_STOP_IDS} token "
                           "ids", param)
    n = vocab_size(shared)
    if any(not 0 <= t < n for t in raw):
        raise RequestError(f"'stop_token_ids' outside the vocabulary (0..{n - 1})", param)
    return tuple(int(t) for t in raw)


def split_probability(shared: Shared, ext: Mapping[str, Any]) -> float:
    """``tracewire.non_canonical`` (a probability, or ``true`` for 0.5), else the server's."""
    raw = ext.get("non_canonical")
    if raw is None:
        return shared.non_canonical
    if raw is True:
        raw = 0.5
    if raw is False:
        raw = 0.0
    if not isinstance(raw, int | float) or not 0.0 <= float(raw) <= 1.0:
        raise RequestError("tracewire.non_canonical must be a probability in [0, 1] or a "
                           "boolean", "tracewire")
    if raw and shared.foreign is None:
        raise RequestError("tracewire.non_canonical needs a server started with a tokenizer "
                           "directory (the built-in vocabulary samples canonically)",
                           "tracewire")
    return float(raw)


async def drive_stops(gen: Generation, stops: Sequence[int]) -> AsyncIterator[TokenStep]:
    """:func:`drive`, also ending (``stop``) after any id in ``stops`` (kept, as vLLM keeps
    ``stop_token_ids`` in ``token_ids``)."""
    ends = set(stops)
    async for s in drive(gen):
        if s.token in ends and gen.finish_reason is None:
            gen.finish_reason = "stop"  # ends the generation: its next step is None
        yield s


@dataclass
class IdRequest:
    """What a token-in endpoint asked for, validated."""

    prompt: list[int]
    params: SamplingParams
    stop_ids: tuple[int, ...] = ()
    split_p: float = 0.0
    seed: int | None = None


class Run:
    """One choice of a token-in request: iterate :meth:`steps`, then read
    :attr:`finish_reason` and :attr:`tokens` (every step's id, stop id included)."""

    def __init__(self, shared: Shared, req: IdRequest, choice: int,
                 policy: Policy | None) -> None:
        self.shared, self.req, self.policy = shared, req, policy
        self.rng = rng_for(shared, req.seed, choice)
        self.tokens: list[int] = []
        self.finish_reason: str | None = None

    async def steps(self) -> AsyncIterator[TokenStep]:
        """The completion's tokens with their reported log-probabilities."""
        source = self._foreign() if self.shared.foreign is not None else self._builtin()
        async for s in source:
            self.tokens.append(s.token)
            yield s

    async def _builtin(self) -> AsyncIterator[TokenStep]:
        p, e = self.req.params, self.shared.engine
        if p.tool_names is None:
            p = replace(p, tool_names=self.shared.template.declared_tools(self.req.prompt))
        gen = Generation(e, self.req.prompt, p, self.rng, self.policy)
        async for s in drive_stops(gen, self.req.stop_ids):
            yield s
        self.finish_reason = gen.finish_reason

    async def _foreign(self) -> AsyncIterator[TokenStep]:
        fm = self.shared.foreign
        assert fm is not None
        p, e = self.req.params, self.shared.engine
        gen = Generation(e, fm.engine_prompt(self.req.prompt), fm.engine_params(p), self.rng,
                         self.policy)
        steps = [s async for s in drive(gen)]
        ended = gen.finish_reason == "stop" and bool(steps) and steps[-1].token == e.tok.eot_id
        args = (steps, ended, p.max_tokens, self.req.stop_ids, self.req.split_p, self.rng)
        try:
            plan = (await asyncio.to_thread(fm.plan, *args) if len(steps) > 2048
                    else fm.plan(*args))
        except ModelError as exc:
            raise RequestError(str(exc)) from exc
        self.finish_reason = plan.finish_reason
        want_top = p.top_logprobs > 0
        for t, lp in zip(plan.ids, plan.logprobs, strict=True):
            # alternatives are not computed over a foreign vocabulary: the sampled one only
            yield TokenStep(t, lp, [(t, lp)] if want_top else [])


async def with_last(run: Run) -> AsyncIterator[tuple[TokenStep, bool]]:
    """The run's steps, each with whether it is the last (then ``run.finish_reason`` is set)."""
    prev: TokenStep | None = None
    async for s in run.steps():
        if prev is not None:
            yield prev, False
        prev = s
    if prev is not None:
        yield prev, True


class TextTail:
    """Text of ids arriving a few at a time: :meth:`add` returns what they add, holding back
    an incomplete character (a byte-level token may end mid-character)."""

    def __init__(self, decode: Callable[[Sequence[int]], str]) -> None:
        self._decode = decode
        self._ids: list[int] = []
        self._start = 0
        self._seen = 0
        self.text = ""

    def add(self, ids: Sequence[int]) -> str:
        """The new text (empty while a character is incomplete)."""
        self._ids.extend(ids)
        # decode a short window, not the whole completion: flat cost per call
        before = self._decode(self._ids[self._start:self._seen])
        now = self._decode(self._ids[self._start:])
        if now.endswith("\ufffd") or len(now) <= len(before):
            return ""
        self._start, self._seen = self._seen, len(self._ids)
        new = now[len(before):]
        self.text += new
        return new

    def flush(self) -> str:
        """Whatever is still held back (at the end of the completion)."""
        before = self._decode(self._ids[self._start:self._seen])
        new = self._decode(self._ids[self._start:])[len(before):]
        self._start = self._seen = len(self._ids)
        self.text += new
        return new
