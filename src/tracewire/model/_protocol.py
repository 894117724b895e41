"""Request validation and response pieces shared by the endpoints (OpenAI / vLLM shapes)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .._errors import ModelError
from ._engine import Engine, SamplingParams, TokenStep

__all__ = [
    "MAX_MODEL_LEN", "MAX_MODEL_LEN_LIMIT", "MODEL_NAME", "RequestError", "Validated", "error_body",
]

#: The one model this server serves.
MODEL_NAME = "tracewire-tiny"
#: Default context length (prompt + completion) in tokens; ``ModelServer(max_model_len=...)``.
MAX_MODEL_LEN = 8192
#: Largest context a server may be configured with (the request body bound caps it anyway).
MAX_MODEL_LEN_LIMIT = 1 << 22
MAX_N = 16
MAX_TOP_LOGPROBS = 20
MAX_STOPS = 8


class RequestError(ModelError):
    """A request the server refuses; carries the HTTP status and OpenAI error fields."""

    def __init__(
        self, message: str, param: str | None = None, status: int = 400,
        code: str | None = None, type_: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.param, self.status, self.code, self.type = param, status, code, type_


def error_body(message: str, type_: str, param: str | None, code: str | None) -> dict[str, Any]:
    """OpenAI-style error JSON."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


class Validated:
    """Typed access to a request body; every getter raises :class:`RequestError` on bad types."""

    def __init__(self, body: Any) -> None:
        if not isinstance(body, Mapping):
            raise RequestError("request body must be a JSON object")
        self.body = body

    def has(self, name: str) -> bool:
        return self.body.get(name) is not None

    def boolean(self, name: str, default: bool = False) -> bool:
        v = self.body.get(name, default)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise RequestError(f"'{name}' must be a boolean", name)
        return v

    def integer(self, name: str, default: int | None, lo: int, hi: int) -> int | None:
        v = self.body.get(name, default)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, int):
            raise RequestError(f"'{name}' must be an integer", name)
        if not lo <= v <= hi:
            raise RequestError(f"'{name}' must be between {lo} and {hi}, got {v}", name)
        return v

    def number(self, name: str, default: float, lo: float, hi: float) -> float:
        v = self.body.get(name, default)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise RequestError(f"'{name}' must be a number", name)
        if not lo <= float(v) <= hi:
            raise RequestError(f"'{name}' must be between {lo} and {hi}, got {v}", name)
        return float(v)

    def model(self) -> None:
        v = self.body.get("model")
        if v is None or v == "":  # token-in clients may send an empty name: the one served
            return
        if not isinstance(v, str):
            raise RequestError("'model' must be a string", "model")
        if v != MODEL_NAME:
            raise RequestError(f"The model `{v}` does not exist; this server serves "
                               f"`{MODEL_NAME}`.", "model", 404, "model_not_found")

    def stops(self) -> tuple[str, ...]:
        v = self.body.get("stop")
        if v is None:
            return ()
        items = [v] if isinstance(v, str) else v
        if (not isinstance(items, list) or len(items) > MAX_STOPS
                or not all(isinstance(s, str) and s for s in items)):
            raise RequestError(f"'stop' must be a non-empty string or a list of at most "
                               f"{MAX_STOPS} of them", "stop")
        return tuple(items)

    def extension(self) -> Mapping[str, Any]:
        v = self.body.get("tracewire")
        if v is None:
            return {}
        if not isinstance(v, Mapping):
            raise RequestError("'tracewire' must be an object", "tracewire")
        return v

    def sampling(
        self, prompt_len: int, default_max: int, allow_zero: bool = False,
        max_model_len: int = MAX_MODEL_LEN,
    ) -> SamplingParams:
        """Common sampling fields; checks the context length like vLLM does."""
        room = max_model_len - prompt_len
        if room <= 0:
            raise RequestError(f"prompt is {prompt_len} tokens; this model's maximum context "
                               f"length is {max_model_len} tokens", "messages", 400,
                               "context_length_exceeded")
        name = "max_completion_tokens" if self.has("max_completion_tokens") else "max_tokens"
        max_tokens = self.integer(name, None, 0 if allow_zero else 1, 1 << 30)
        if max_tokens is None:
            max_tokens = min(default_max, room)
        elif max_tokens > room:
            raise RequestError(f"'{name}' is {max_tokens} but only {room} tokens of context "
                               f"remain after the {prompt_len}-token prompt (maximum context "
                               f"length {max_model_len})", name, 400, "context_length_exceeded")
        return SamplingParams(
            temperature=self.number("temperature", 1.0, 0.0, 2.0),
            top_p=self.number("top_p", 1.0, 1e-9, 1.0),
            max_tokens=max_tokens,
            stop=self.stops(),
        )

    def seed(self) -> int | None:
        return self.integer("seed", None, -(1 << 63), (1 << 64) - 1)


def tool_choice(v: Validated, engine: Engine) -> tuple[str, tuple[int, ...]]:
    """Constraint mode and forced prefix of ``tool_choice`` (``none`` when no tools given)."""
    tc = v.body.get("tool_choice")
    has_tools = v.has("tools")
    if tc is None:
        return ("auto" if has_tools else "none"), ()
    if tc in ("auto", "none", "required"):
        if tc != "none" and not has_tools:
            raise RequestError(f"tool_choice '{tc}' needs 'tools'", "tool_choice")
        return str(tc), ()
    fn = tc.get("function") if isinstance(tc, Mapping) else None
    if isinstance(fn, Mapping) and isinstance(fn.get("name"), str) and fn["name"] and has_tools:
        tok = engine.tok
        sp = tok.special
        return "one", (sp["<|call|>"], *tok.encode(fn["name"]), sp["<|args|>"])
    raise RequestError("tool_choice must be 'auto', 'none', 'required' or "
                       "{'type': 'function', 'function': {'name': ...}} with tools", "tool_choice")


def forced_calls(raw: Any) -> list[tuple[str, str]]:
    """Tool calls of the forcing extension: ``{name, arguments}`` or OpenAI-shaped."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise RequestError("tracewire.force.tool_calls must be a list", "tracewire")
    out: list[tuple[str, str]] = []
    for c in raw:
        fn = c.get("function", c) if isinstance(c, Mapping) else None
        if (not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or not fn["name"]
                or not isinstance(fn.get("arguments", ""), str)):
            raise RequestError("each forced tool call needs a non-empty string 'name' and a "
                               "string 'arguments'", "tracewire")
        out.append((fn["name"], fn.get("arguments", "")))
    return out


@dataclass
class TokenRender:
    """How tokens appear in logprobs (``return_tokens_as_token_ids``)."""

    engine: Engine
    as_ids: bool

    def text(self, tid: int) -> str:
        return f"token_id:{tid}" if self.as_ids else self.engine.tok.token_text(tid)

    def chat_entry(self, s: TokenStep) -> dict[str, Any]:
        tb = self.engine.tok.token_bytes
        return {"token": self.text(s.token), "logprob": s.logprob, "bytes": list(tb(s.token)),
                "top_logprobs": [{"token": self.text(t), "logprob": lp, "bytes": list(tb(t))}
                                 for t, lp in s.top]}


def completion_logprobs(
    render: TokenRender, steps: Sequence[TokenStep | None], ids: Sequence[int], offset0: int,
    want_top: bool,
) -> dict[str, Any]:
    """Legacy completions ``logprobs`` object (``tokens``, ``token_logprobs``, ...)."""
    tokens, lps, tops, offsets = [], [], [], []
    off = offset0
    for t, s in zip(ids, steps, strict=True):
        tokens.append(render.text(t))
        offsets.append(off)
        off += len(render.engine.tok.token_text(t))
        lps.append(None if s is None else s.logprob)
        if want_top:
            tops.append(None if s is None else {render.text(a): lp for a, lp in s.top})
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops if want_top else None,
            "text_offset": offsets}
