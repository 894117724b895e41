"""llama.cpp's ``llama-server`` native ``POST /completion`` as a token-in/token-out endpoint.

The request carries ``prompt`` as ids, ``return_tokens``, ``cache_prompt``, ``n_probs`` and
``post_sampling_probs``, and names every sampler: the chain is exactly what the harness asked
for (temperature first, then the truncations, as vLLM orders them), every other sampler sent
at its neutral value, so the server's defaults (top_k 40, top_p 0.95, min_p 0.05) never
truncate silently. With ``post_sampling_probs`` the server reports each sampled token's
probability under the distribution its ``dist`` sampler drew from (after penalties,
temperature and truncation); the recorded logprob is ``log(prob)``. Without it the server
reports the softmax of the raw logits, which is not the sampling distribution as soon as
the temperature is not 1 or anything truncates.

Settings whose reported probability is not the one the token was drawn with are refused
(400): mirostat and adaptive-p (they select the token themselves, with per-request state),
XTC (a random coin removes the top tokens: the report is conditional on the coin), grammar,
JSON schema and ``response_format`` (rejection sampling: a token that fails the grammar is
redrawn from a second distribution), and a harness-chosen ``samplers`` chain.

Two things the server does that the decoder guards: it stops on end-of-generation tokens
itself (the close token is the last id, ``stop_type`` ``eos``), and it withholds a token
that ends inside a multi-byte UTF-8 character until the character completes. Unstreamed,
such a token is in ``tokens`` but has no probability entry: its logprob is recorded as NaN
(unknown, never invented). Streamed, its id is never sent (``tokens_predicted`` jumps):
:class:`WithheldIdsError` says how many ids came before the gap, and the upstream asks for
the rest unstreamed from there (a fresh draw at the gap, so nothing is biased).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ._errors import UpstreamShapeError

__all__ = ["HONEST_KEYS", "REFUSED", "LlamaStream", "WithheldIdsError", "cut_at_stop",
           "decode_completion", "encode_completion", "refusal"]

#: Harness sampling keys forwarded to llama-server (``repetition_penalty`` is vLLM's name
#: for its ``repeat_penalty``). Each is deterministic given the context, so the post-chain
#: probability is still the one sampled from.
HONEST_KEYS = ("temperature", "top_p", "top_k", "min_p", "typical_p", "presence_penalty",
               "frequency_penalty", "repetition_penalty", "repeat_penalty", "repeat_last_n",
               "seed", "logit_bias", "top_n_sigma", "dynatemp_range", "dynatemp_exponent",
               "dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n",
               "min_keep")

#: Keys refused when set to a non-neutral value, with why (see the module docstring).
REFUSED: dict[str, str] = {
    "mirostat": "mirostat selects the token itself with state that restarts each request",
    "adaptive_target": "adaptive-p selects the token itself with per-request state",
    "xtc_probability": "XTC removes the top tokens on a random coin; the reported "
                       "probability is conditional on the coin, not the one sampled with",
    "grammar": "grammar sampling redraws rejected tokens from a second distribution",
    "json_schema": "grammar sampling redraws rejected tokens from a second distribution",
    "response_format": "structured output is grammar sampling (rejected tokens redrawn)",
    "samplers": "the sampler chain is set by the proxy so the recorded logprob is honest",
}

class WithheldIdsError(UpstreamShapeError):
    """llama-server's stream skipped ids (a character split across tokens is sent only once
    complete); ``received`` ids came before the gap. The caller may ask for the rest
    unstreamed from there."""

    def __init__(self, message: str, received: int) -> None:
        super().__init__(message)
        self.received = received


_NEUTRAL: dict[str, Any] = {
    "top_k": 0, "top_p": 1.0, "min_p": 0.0, "typical_p": 1.0, "top_n_sigma": -1.0,
    "repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
    "dry_multiplier": 0.0, "xtc_probability": 0.0, "mirostat": 0, "dynatemp_range": 0.0,
    "adaptive_target": -1.0}

# Chain order (temperature first, as vLLM applies it before top-k/top-p/min-p), and which
# request key switches each sampler on.
_CHAIN = (("penalties", ("repeat_penalty", "presence_penalty", "frequency_penalty")),
          ("dry", ("dry_multiplier",)), ("temperature", ()), ("top_n_sigma", ("top_n_sigma",)),
          ("top_k", ("top_k",)), ("typ_p", ("typical_p",)), ("top_p", ("top_p",)),
          ("min_p", ("min_p",)))


def _is_neutral(key: str, value: Any) -> bool:
    if value is None:
        return True
    if key in ("grammar", "json_schema", "samplers"):
        return not value
    if key == "response_format":
        return isinstance(value, dict) and value.get("type") in (None, "text")
    if key == "adaptive_target":
        return isinstance(value, int | float) and value < 0
    return bool(value == _NEUTRAL.get(key))


def refusal(body: Mapping[str, Any]) -> str | None:
    """Why the harness's sampling settings in ``body`` cannot be recorded honestly through
    llama-server (None when they can)."""
    for key, why in REFUSED.items():
        if key in body and not _is_neutral(key, body[key]):
            return f"{key} is refused with --upstream-api llamacpp: {why}"
    return None


def encode_completion(prompt_ids: Sequence[int], *, max_tokens: int, temperature: float,
                      n_probs: int, extra: Mapping[str, Any], stream: bool
                      ) -> dict[str, Any]:
    """The ``/completion`` body continuing ``prompt_ids``; ``extra`` holds the harness's
    keys of :data:`HONEST_KEYS` (the rest of the chain is sent neutral)."""
    sp = dict(_NEUTRAL)
    for k, v in extra.items():
        if k in HONEST_KEYS and v is not None:
            sp["repeat_penalty" if k == "repetition_penalty" else k] = v
    top_k = sp["top_k"]
    if isinstance(top_k, int) and top_k < 0:
        sp["top_k"] = 0  # vLLM spells "off" -1; llama.cpp 0
    chain = [name for name, keys in _CHAIN
             if not keys or any(sp.get(k) != _NEUTRAL.get(k) for k in keys)]
    return {"prompt": list(prompt_ids), "n_predict": int(max_tokens),
            "temperature": float(temperature), **sp, "samplers": chain,
            "n_probs": max(1, int(n_probs)), "post_sampling_probs": True,
            "backend_sampling": False, "return_tokens": True, "cache_prompt": True,
            "ignore_eos": False, "stream": stream}


def _finish(body: Mapping[str, Any]) -> str | None:
    stop = body.get("stop_type")
    if body.get("truncated") is True or stop == "limit":
        return "length"
    if stop in ("eos", "word"):
        return "stop"
    return None


def _prob_entry(e: Any) -> tuple[int, float]:
    """(id, log prob) of one ``completion_probabilities`` entry. Only ``prob`` (what the
    server reports with ``post_sampling_probs``) is recorded: a ``logprob`` there is the raw
    logits' softmax, not the sampling distribution, so such a reply is refused."""
    if not isinstance(e, dict):
        raise UpstreamShapeError("llama-server completion_probabilities entry is not an object")
    tid = e.get("id")
    if not isinstance(tid, int) or isinstance(tid, bool):
        raise UpstreamShapeError("llama-server probability entry has no integer id")
    p = e.get("prob")
    if p is None:
        raise UpstreamShapeError("llama-server reported no post-sampling prob (raw-logit "
                                 "logprobs are not the sampling distribution); not recorded")
    if not isinstance(p, int | float) or isinstance(p, bool) or not 0.0 < p <= 1.0:
        raise UpstreamShapeError(f"llama-server reported prob {p!r} for a sampled token")
    return tid, math.log(p)


def _usage(body: Mapping[str, Any], n: int) -> dict[str, int]:
    out = {"completion_tokens": n}
    ev = body.get("tokens_evaluated")
    if isinstance(ev, int):
        out["prompt_tokens"] = ev
        out["total_tokens"] = ev + n
    return out


def decode_completion(body: Any) -> tuple[list[int], list[float], str | None, str,
                                          dict[str, int], dict[str, Any]]:
    """(ids, logprobs, finish reason, text, usage, timings) of an unstreamed reply.

    A token without a probability entry (withheld mid-character) gets NaN; entries are
    matched to ids in order, and one that matches no id is a shape error."""
    if not isinstance(body, dict):
        raise UpstreamShapeError("llama-server reply is not a JSON object")
    ids = body.get("tokens")
    if not isinstance(ids, list):
        raise UpstreamShapeError("llama-server reply has no tokens (return_tokens not honoured)")
    probs = body.get("completion_probabilities")
    if probs is None and ids:
        raise UpstreamShapeError("llama-server reply has no completion_probabilities")
    if not isinstance(probs, list | None):
        raise UpstreamShapeError("llama-server completion_probabilities is not a list")
    lps = [math.nan] * len(ids)
    j = 0
    entries = probs or []
    for i, tid in enumerate(ids):
        if j < len(entries):
            pid, lp = _prob_entry(entries[j])
            if pid == tid:
                lps[i] = lp
                j += 1
    if j != len(entries):
        raise UpstreamShapeError(
            f"llama-server reply: {len(entries) - j} probability entries match no sampled "
            "id; not recorded")
    text = body.get("content")
    timings = body.get("timings")
    return (ids, lps, _finish(body), text if isinstance(text, str) else "",
            _usage(body, len(ids)), timings if isinstance(timings, dict) else {})


class LlamaStream:
    """Folds llama-server's streamed chunks (one per emitted token, then a last one with
    ``stop: true``); raises :class:`WithheldIdsError` where ids were withheld
    (``tokens_predicted`` ahead of the ids received)."""

    def __init__(self) -> None:
        self.n = 0
        self.finish_reason: str | None = None
        self.usage: dict[str, int] = {}
        self.timings: dict[str, Any] = {}
        self.done = False

    def feed(self, chunk: Any) -> tuple[list[int], list[float], str]:
        """(ids, logprobs, text) one chunk adds."""
        if not isinstance(chunk, dict):
            raise UpstreamShapeError("llama-server stream chunk is not a JSON object")
        ids = chunk.get("tokens") or []
        if not isinstance(ids, list):
            raise UpstreamShapeError("llama-server stream chunk tokens is not a list")
        lps: list[float] = []
        if ids:
            entries = chunk.get("completion_probabilities")
            if not isinstance(entries, list) or len(entries) != len(ids):
                raise UpstreamShapeError("llama-server stream chunk: probability entries do "
                                         "not match its tokens; not recorded")
            for tid, e in zip(ids, entries, strict=True):
                pid, lp = _prob_entry(e)
                if pid != tid:
                    raise UpstreamShapeError("llama-server stream chunk: probability entry "
                                             "for another id; not recorded")
                lps.append(lp)
        predicted = chunk.get("tokens_predicted")
        if isinstance(predicted, int) and predicted > self.n + len(ids):
            raise WithheldIdsError(
                f"llama-server's stream withheld {predicted - self.n - len(ids)} token "
                "id(s) (a character split across tokens is sent only once complete)", self.n)
        self.n += len(ids)
        if chunk.get("stop") is True:
            self.last(chunk, self.n)
            self.finish_reason = _finish(chunk)
        text = chunk.get("content")
        return ids, lps, text if isinstance(text, str) else ""

    def last(self, chunk: Mapping[str, Any], n: int) -> None:
        """Take usage and timings from the server's last chunk (``n`` ids recorded)."""
        self.done = True
        self.usage = _usage(chunk, n)
        t = chunk.get("timings")
        self.timings = t if isinstance(t, dict) else {}


def cut_at_stop(ids: Sequence[int], stop_ids: Sequence[int] | frozenset[int]
                ) -> int | None:
    """The length up to and including the first of ``stop_ids`` in ``ids`` (None when none
    is there): the server stops only on its own end-of-generation ids, a template's other
    stop ids are enforced here."""
    if stop_ids:
        stops = stop_ids if isinstance(stop_ids, frozenset) else frozenset(stop_ids)
        for i, t in enumerate(ids):
            if t in stops:
                return i + 1
    return None
