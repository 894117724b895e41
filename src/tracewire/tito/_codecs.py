"""Request bodies for, and replies from, the model servers' token-in/token-out endpoints.

Pure functions over dicts: no session, no socket (the upstream that uses them owns those).

- vLLM ``POST /v1/completions`` with ``prompt`` a list of ids, ``return_token_ids``,
  ``logprobs``, ``return_tokens_as_token_ids``, ``skip_special_tokens: false`` and the
  template's ``stop_token_ids``; streamed (prompt ids in the first chunk, output ids as
  deltas) or not.
- vLLM ``POST /inference/v1/generate``: ``{token_ids, sampling_params, model, request_id}``,
  answered with ids and ``logprobs.content[j].logprob`` and no text. ``max_tokens`` is
  always sent (some builds default it to 16).
- SGLang ``POST /generate``: ``input_ids``, ``return_logprob``, ``logprob_start_len: -1``
  (output only, keeps prefix caching); ``meta_info.output_token_logprobs`` holds
  ``[logprob, id, text|null]`` triples. Streamed chunks carry the output so far
  (cumulative) unless the server runs with incremental streaming output.
- llama.cpp's ``llama-server`` ``POST /completion`` (``prompt`` as ids, ``return_tokens``,
  ``post_sampling_probs``; one chunk per token streamed): :mod:`tracewire.tito._llamacpp`,
  which also decides which sampling settings can be recorded honestly.

A reply whose logprob count differs from its completion length, or whose ids are missing,
not integers or outside ``[0, 2**31)``, raises :class:`~tracewire.tito.UpstreamShapeError`
(502); :func:`check_ids` bounds a completion by the vocabulary and the requested length.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from . import _llamacpp as llama
from ._errors import UpstreamShapeError
from ._ids import ID_BOUND, LENGTH_SLACK, check_ids

__all__ = ["ID_BOUND", "LENGTH_SLACK", "Generation", "GenerationDelta", "SamplingParams",
           "StreamDecoder", "UpstreamApi", "check_ids", "decode_response", "encode_request",
           "error_message", "refusal", "request_path", "sampling_keys"]

class UpstreamApi(StrEnum):
    """Which token-in endpoint the model server is asked on."""

    COMPLETIONS = "completions"
    GENERATE = "generate"
    SGLANG = "sglang"
    LLAMACPP = "llamacpp"


_PATHS = {UpstreamApi.COMPLETIONS: "/v1/completions",
          UpstreamApi.GENERATE: "/inference/v1/generate",
          UpstreamApi.SGLANG: "/generate",
          UpstreamApi.LLAMACPP: "/completion"}

#: Sampling keys passed through as they are, when the harness set them.
PASSTHROUGH = ("top_k", "min_p", "presence_penalty", "frequency_penalty",
               "repetition_penalty", "seed")


def request_path(api: UpstreamApi) -> str:
    """The endpoint's path on the server (no ``/v1`` base added to the generate routes)."""
    return _PATHS[api]


def sampling_keys(api: UpstreamApi) -> tuple[str, ...]:
    """The harness's sampling keys forwarded to ``api`` (besides temperature and top_p)."""
    return llama.HONEST_KEYS if api is UpstreamApi.LLAMACPP else PASSTHROUGH


def refusal(api: UpstreamApi, body: dict[str, Any]) -> str | None:
    """Why ``body``'s sampling settings cannot be served with an honest recorded logprob
    on ``api`` (None when they can; only llama-server's chain is checked)."""
    return llama.refusal(body) if api is UpstreamApi.LLAMACPP else None


@dataclass(slots=True)
class SamplingParams:
    """What to sample: ``max_tokens`` is required (servers' defaults are as low as 16);
    ``top_logprobs`` alternatives per token besides the sampled one's logprob."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    stop_ids: Sequence[int] = ()
    top_logprobs: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def encode_request(api: UpstreamApi, prompt_ids: Sequence[int], params: SamplingParams, *,
                   model: str = "", stream: bool = False, request_id: str | None = None
                   ) -> dict[str, Any]:
    """The JSON body asking ``api`` to continue ``prompt_ids``."""
    if api is UpstreamApi.LLAMACPP:
        return llama.encode_completion(
            prompt_ids, max_tokens=params.max_tokens, temperature=params.temperature,
            n_probs=params.top_logprobs,
            extra={**params.extra, "top_p": params.top_p}, stream=stream)
    extra = {k: params.extra[k] for k in PASSTHROUGH if params.extra.get(k) is not None}
    stops = [int(i) for i in params.stop_ids]
    if api is UpstreamApi.COMPLETIONS:
        body: dict[str, Any] = {
            "model": model, "prompt": list(prompt_ids), "max_tokens": params.max_tokens,
            "temperature": params.temperature, "top_p": params.top_p,
            "logprobs": params.top_logprobs, "return_token_ids": True,
            "return_tokens_as_token_ids": True, "skip_special_tokens": False,
            "stop_token_ids": stops, "stream": stream, **extra}
        if stream:
            body["stream_options"] = {"include_usage": True}
        return body
    if api is UpstreamApi.GENERATE:
        sp = {"max_tokens": params.max_tokens, "temperature": params.temperature,
              "top_p": params.top_p, "logprobs": params.top_logprobs,
              "stop_token_ids": stops, "skip_special_tokens": False, **extra}
        body = {"token_ids": list(prompt_ids), "sampling_params": sp, "stream": stream}
        if model:
            body["model"] = model
        if request_id:
            body["request_id"] = request_id
        return body
    sp = {"max_new_tokens": params.max_tokens, "temperature": params.temperature,
          "top_p": params.top_p, "stop_token_ids": stops, "skip_special_tokens": False,
          "no_stop_trim": True, **extra}
    body = {"input_ids": list(prompt_ids), "sampling_params": sp, "return_logprob": True,
            "logprob_start_len": -1, "top_logprobs_num": params.top_logprobs,
            "stream": stream}
    if request_id:
        body["rid"] = request_id
    return body


@dataclass(slots=True)
class Generation:
    """One completion: the sampled ``ids`` and their ``logprobs`` (same length), how it
    ended, the server's text when it sent any, and the prompt ids when it echoed them."""

    ids: list[int]
    logprobs: list[float]
    finish_reason: str | None = None
    text: str | None = None
    prompt_ids: list[int] | None = None
    usage: dict[str, int] = field(default_factory=dict)
    #: The server's own timings when it reports them (llama-server's ``timings``).
    timings: dict[str, Any] = field(default_factory=dict)

    @property
    def ended_by_stop(self) -> bool:
        """Whether it ended on a stop token rather than by length or abort."""
        return self.finish_reason == "stop"


@dataclass(slots=True)
class GenerationDelta:
    """What one streamed chunk adds."""

    ids: list[int]
    logprobs: list[float]
    text: str = ""
    finish_reason: str | None = None


def error_message(body: Any) -> str | None:
    """The server's own error message in an error body (vLLM's and SGLang's shapes)."""
    if not isinstance(body, dict):
        return None
    err = body.get("error")
    if isinstance(err, dict) and err.get("message"):
        return str(err["message"])
    if isinstance(err, str):
        return err
    if body.get("object") == "error" and body.get("message"):
        return str(body["message"])
    return None


def _ints(v: Any, what: str) -> list[int]:
    if not isinstance(v, list):
        raise UpstreamShapeError(f"upstream reply: {what} is not a list of integer ids")
    check_ids(v, what=what)
    return v


def _floats(v: Sequence[Any], what: str) -> list[float]:
    out = []
    for x in v:
        if x is None:
            out.append(math.nan)  # a server may not score the first token; keep the slot
        elif isinstance(x, int | float) and not isinstance(x, bool):
            out.append(float(x))
        else:
            raise UpstreamShapeError(f"upstream reply: {what} holds a non-number")
    return out


def _token_ids(tokens: Any) -> list[int] | None:
    if not isinstance(tokens, list) or not tokens:
        return None
    out = []
    for t in tokens:
        if not (isinstance(t, str) and t.startswith("token_id:")):
            return None
        try:
            out.append(int(t[9:]))
        except ValueError:
            return None
    return out


def _choice(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise UpstreamShapeError("upstream reply is not a JSON object")
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise UpstreamShapeError(error_message(body) or "upstream reply has no choices")
    ch: dict[str, Any] = choices[0]
    return ch


def _finish(v: Any) -> str | None:
    if isinstance(v, dict):  # SGLang: {"type": "stop" | "length" | "abort", ...}
        v = v.get("type")
    return None if v is None else str(v)


def _usage(body: dict[str, Any]) -> dict[str, int]:
    u = body.get("usage")
    return {k: v for k, v in u.items() if isinstance(v, int)} if isinstance(u, dict) else {}


def _vllm_piece(ch: dict[str, Any], api: UpstreamApi) -> GenerationDelta:
    ids = ch.get("token_ids")
    lp = ch.get("logprobs")
    lps: list[float] = []
    tok_ids = None
    if isinstance(lp, dict):
        if api is UpstreamApi.COMPLETIONS:
            lps = _floats(lp.get("token_logprobs") or [], "token_logprobs")
            tok_ids = _token_ids(lp.get("tokens"))
        else:
            content = lp.get("content") or []
            lps = _floats([e.get("logprob") if isinstance(e, dict) else "x" for e in content],
                          "logprobs.content")
            tok_ids = _token_ids([e.get("token") for e in content if isinstance(e, dict)])
    if ids is None:
        ids = tok_ids
    out = _ints(ids if ids is not None else [], "token_ids")
    if tok_ids is not None and tok_ids != out:
        raise UpstreamShapeError("upstream reply: logprob tokens disagree with token_ids")
    text = ch.get("text")
    return GenerationDelta(out, lps, text if isinstance(text, str) else "",
                           _finish(ch.get("finish_reason")))


def _sglang_piece(body: dict[str, Any]) -> tuple[GenerationDelta, list[int] | None]:
    meta = body.get("meta_info")
    if not isinstance(meta, dict):
        raise UpstreamShapeError(error_message(body) or "SGLang reply has no meta_info")
    olp = meta.get("output_token_logprobs")
    if not isinstance(olp, list):
        raise UpstreamShapeError("SGLang reply has no output_token_logprobs")
    if not all(isinstance(e, list | tuple) and len(e) >= 2 for e in olp):
        raise UpstreamShapeError("SGLang output_token_logprobs entries are not triples")
    ids = _ints([e[1] for e in olp], "output_token_logprobs ids")
    lps = _floats([e[0] for e in olp], "output_token_logprobs")
    out_ids = body.get("output_ids")
    if out_ids is not None and _ints(out_ids, "output_ids") != ids:
        # The triples are the logprobs; output_ids the completion: they must agree.
        raise UpstreamShapeError(
            f"SGLang reply has {len(ids)} logprobs for {len(out_ids)} completion tokens "
            "(or other ids); not recorded")
    text = body.get("text")
    return (GenerationDelta(ids, lps, text if isinstance(text, str) else "",
                            _finish(meta.get("finish_reason"))),
            out_ids)


def _checked(g: Generation) -> Generation:
    if len(g.logprobs) != len(g.ids):
        raise UpstreamShapeError(
            f"upstream reply has {len(g.logprobs)} logprobs for {len(g.ids)} completion "
            "tokens; not recorded")
    return g


def decode_response(api: UpstreamApi, body: Any, *, stop_ids: Sequence[int] = ()
                    ) -> Generation:
    """The :class:`Generation` in a non-streamed reply of ``api``; ``stop_ids`` cut a
    llama-server completion after the first of them (it stops only on its own
    end-of-generation ids)."""
    if api is UpstreamApi.LLAMACPP:
        msg = error_message(body)
        if msg is not None:
            raise UpstreamShapeError(f"llama-server failed: {msg}")
        ids, lps, finish, text, usage, timings = llama.decode_completion(body)
        _ints(ids, "tokens")
        n = llama.cut_at_stop(ids, stop_ids)
        if n is not None:
            text = text if n == len(ids) else ""
            ids, lps, finish = ids[:n], lps[:n], "stop"
            usage = {**usage, "completion_tokens": n}
        if finish is None:
            raise UpstreamShapeError("llama-server reply did not say how it stopped "
                                     f"(stop_type {body.get('stop_type')!r}); not recorded")
        return _checked(Generation(ids, lps, finish, text or None, None, usage, timings))
    if api is UpstreamApi.SGLANG:
        if not isinstance(body, dict):
            raise UpstreamShapeError("upstream reply is not a JSON object")
        piece, _ = _sglang_piece(body)
        meta = body["meta_info"]
        usage = {k: int(meta[k]) for k in ("prompt_tokens", "completion_tokens")
                 if isinstance(meta.get(k), int)}
        return _checked(Generation(piece.ids, piece.logprobs, piece.finish_reason,
                                   piece.text or None, None, usage))
    ch = _choice(body)
    piece = _vllm_piece(ch, api)
    prompt = ch.get("prompt_token_ids", body.get("prompt_token_ids"))
    return _checked(Generation(
        piece.ids, piece.logprobs, piece.finish_reason,
        piece.text if api is UpstreamApi.COMPLETIONS else None,
        _ints(prompt, "prompt_token_ids") if prompt is not None else None, _usage(body)))


class StreamDecoder:
    """Folds a streamed reply's chunks (parsed ``data:`` objects) into deltas, then checks
    and returns the whole :class:`Generation`. ``cumulative`` (SGLang's default): each
    chunk repeats the output so far."""

    def __init__(self, api: UpstreamApi, *, cumulative: bool = True,
                 stop_ids: Sequence[int] = ()) -> None:
        self.api = api
        self.cumulative = cumulative and api is UpstreamApi.SGLANG
        self.gen = Generation([], [])
        self._text = ""
        self._llama = llama.LlamaStream() if api is UpstreamApi.LLAMACPP else None
        self._stops = frozenset(int(i) for i in stop_ids)
        self._stopped = False

    @property
    def done(self) -> bool:
        """Whether the reply is complete (llama-server: its last chunk came, or a stop id
        did); the caller stops reading then."""
        if self._llama is None:
            return False
        return self._llama.done

    def _feed_llama(self, chunk: Any, st: llama.LlamaStream) -> GenerationDelta:
        g = self.gen
        if self._stopped:
            # After a stop id: the server's last chunk (it stopped too), or ids past a stop
            # it does not know, dropped (the caller stops reading, which cancels them).
            if isinstance(chunk, dict) and chunk.get("stop") is True:
                st.last(chunk, len(g.ids))
                g.usage, g.timings = st.usage, st.timings
            st.done = True
            return GenerationDelta([], [])
        ids, lps, text = st.feed(chunk)
        _ints(ids, "tokens")
        g.usage, g.timings = st.usage or g.usage, st.timings or g.timings
        n = llama.cut_at_stop(ids, self._stops)
        if n is None:
            return GenerationDelta(ids, lps, text, st.finish_reason if st.done else None)
        self._stopped = True
        return GenerationDelta(ids[:n], lps[:n], text if n == len(ids) else "", "stop")

    def feed(self, chunk: Any) -> GenerationDelta:
        """The ids, logprobs and text one chunk adds."""
        if not isinstance(chunk, dict):
            raise UpstreamShapeError("upstream stream chunk is not a JSON object")
        msg = error_message(chunk)
        if msg is not None:
            raise UpstreamShapeError(f"upstream stream failed: {msg}")
        g = self.gen
        if self._llama is not None:
            piece = self._feed_llama(chunk, self._llama)
        elif self.api is UpstreamApi.SGLANG:
            piece, _ = _sglang_piece(chunk)
            if self.cumulative:
                n = len(g.ids)
                if piece.ids[:n] != g.ids or not piece.text.startswith(self._text):
                    raise UpstreamShapeError("SGLang stream chunk does not extend the output")
                full_text = piece.text
                piece = GenerationDelta(piece.ids[n:], piece.logprobs[n:],
                                        full_text[len(self._text):], piece.finish_reason)
                self._text = full_text
        else:
            if not chunk.get("choices"):  # the usage-only last chunk
                g.usage = _usage(chunk) or g.usage
                return GenerationDelta([], [])
            ch = _choice(chunk)
            piece = _vllm_piece(ch, self.api)
            prompt = ch.get("prompt_token_ids", chunk.get("prompt_token_ids"))
            if prompt is not None and g.prompt_ids is None:
                g.prompt_ids = _ints(prompt, "prompt_token_ids")
            g.usage = _usage(chunk) or g.usage
        g.ids.extend(piece.ids)
        g.logprobs.extend(piece.logprobs)
        if piece.text:
            g.text = (g.text or "") + piece.text
        if piece.finish_reason is not None:
            g.finish_reason = piece.finish_reason
        return piece

    def finish(self) -> Generation:
        """The whole generation, checked (logprob count = completion length; a llama-server
        stream must have said how it stopped)."""
        if self._llama is not None and self.gen.finish_reason is None:
            raise UpstreamShapeError("llama-server stream ended before its last chunk; "
                                     "not recorded")
        return _checked(self.gen)
