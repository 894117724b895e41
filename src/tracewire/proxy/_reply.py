"""The read step of a turn: token ids, logprobs and messages out of upstream
chat-completion replies, into the turn's :class:`Outcome`.

Understands vLLM (``prompt_token_ids``, ``choices[i].token_ids``, ``logprobs.content``,
``token_id:N`` tokens) and SGLang (``choices[i].meta_info.output_token_logprobs`` =
``[[logprob, token_id, text?], ...]``, prompt ids as ``input_ids``), streamed or not.
Never invents ids: a reply without them leaves them None.
"""

from __future__ import annotations

from typing import Any

from .._errors import UpstreamError
from ..trace import ToolCall
from ._prompt import PromptIds, as_ids
from ._rawjson import RawSpan
from ._turn_types import Choice, Outcome
from ._upstream_api import UpstreamReply

__all__ = ["StreamAccumulator", "outcome_of", "read_reply"]

#: Ids are int32 on the trace.
_ID_BOUND = 2**31


def _checked(ids: list[int]) -> list[int]:
    # A reply id the trace cannot hold fails the call (502, recorded as failed) instead of
    # failing the recording after the harness got its answer.
    if ids and (min(ids) < 0 or max(ids) >= _ID_BOUND):
        raise UpstreamError("upstream reply: a token id is outside [0, 2**31); not recorded")
    return ids


def _prompt_ids(d: dict[str, Any]) -> Any:
    ids = d.get("prompt_token_ids")
    if ids is None:
        ids = d.get("input_ids")
    if ids is None:
        for ch in d.get("choices") or ():
            meta = ch.get("meta_info") if isinstance(ch, dict) else None
            if isinstance(meta, dict) and meta.get("input_ids") is not None:
                return meta["input_ids"]
    return ids


def _from_logprobs(ch: dict[str, Any]) -> tuple[list[int] | None, list[float] | None]:
    """(ids, logprobs) a choice's logprob fields give, when they give them."""
    lp = ch.get("logprobs")
    ids: list[int] | None = None
    lps: list[float] | None = None
    if isinstance(lp, dict) and isinstance(lp.get("content"), list):
        content = lp["content"]
        try:  # every entry has its logprob (vLLM, SGLang): no default looked up per token
            lps = [float(e["logprob"]) for e in content]
        except (KeyError, TypeError):
            lps = [float(e.get("logprob", float("nan"))) for e in content]
        # Ids spelled as tokens ("token_id:N", vLLM's return_tokens_as_token_ids): the
        # first entry says whether to look at the others.
        first = content[0].get("token") if content else None
        if isinstance(first, str) and first.startswith("token_id:"):
            toks = [e.get("token") for e in content]
            if all(isinstance(t, str) and t.startswith("token_id:") for t in toks):
                ids = [int(t[9:]) for t in toks]
    meta = ch.get("meta_info")
    if isinstance(meta, dict) and isinstance(meta.get("output_token_logprobs"), list):
        out = meta["output_token_logprobs"]
        ids = [int(e[1]) for e in out]
        lps = [float("nan") if e[0] is None else float(e[0]) for e in out]
    return ids, lps


def _tool_calls(raw: Any) -> list[ToolCall]:
    out = []
    for tc in raw or ():
        fn = tc.get("function") or {}
        out.append(ToolCall(id=str(tc.get("id") or ""), name=str(fn.get("name") or ""),
                            arguments=str(fn.get("arguments") or ""),
                            type=str(tc.get("type") or "function")))
    return out


def _full_prompt(d: dict[str, Any]) -> PromptIds | None:
    ids = as_ids(_prompt_ids(d))
    return None if ids is None else PromptIds(full=ids)


def outcome_of(d: dict[str, Any], split: bool = False) -> Outcome:
    """The :class:`Outcome` of a non-streamed chat completion. With ``split`` (``d`` came
    from ``_prompt_cut.loads_split`` with a span) the prompt is left for the caller to read."""
    out = Outcome(model=str(d.get("model") or ""), prompt=None if split else _full_prompt(d))
    for i, ch in enumerate(d.get("choices") or ()):
        msg = ch.get("message") or {}
        ids, lps = _from_logprobs(ch)
        if isinstance(ch.get("token_ids"), list):
            ids = [int(t) for t in ch["token_ids"]]
        if ids is not None:
            _checked(ids)
        reasoning = msg.get("reasoning_content", msg.get("reasoning"))
        out.choices.append(Choice(
            index=int(ch.get("index", i)), content=msg.get("content"),
            reasoning=reasoning if isinstance(reasoning, str) else None,
            tool_calls=_tool_calls(msg.get("tool_calls")),
            finish_reason=ch.get("finish_reason"), token_ids=ids, logprobs=lps,
        ))
    usage = d.get("usage")
    if isinstance(usage, dict):
        out.usage = {k: int(v) for k, v in usage.items() if isinstance(v, int)}
    return out


def read_reply(d: dict[str, Any], reply: UpstreamReply) -> Outcome:
    """The :class:`Outcome` of a non-streamed ``reply`` whose dict is ``d`` (its ``data``,
    or what a response hook made of it); the prompt ids at ``reply.span`` are left for the
    caller to read. ``UpstreamError`` when the answer is unusable."""
    try:
        out = outcome_of(d, reply.span is not None)
    except (ValueError, TypeError, AttributeError) as exc:
        raise UpstreamError(f"upstream answered something unusable: {exc}") from exc
    if reply.logprobs is not None and out.choices:
        out.choices[0].logprobs = reply.logprobs  # handed over, not in the dict
    if reply.span is not None:
        out.span = reply.span
    return out


class StreamAccumulator:
    """Builds the :class:`Outcome` of a streamed chat completion chunk by chunk."""

    def __init__(self) -> None:
        self.out = Outcome()
        self._choices: dict[int, Choice] = {}
        self._tcs: dict[int, dict[int, dict[str, str]]] = {}
        self._prompt: list[int] | None = None
        #: Where the prompt ids array lies in the chunk that carried it (left unparsed).
        self.prompt_span: RawSpan | None = None

    def add(self, chunk: dict[str, Any], span: RawSpan | None = None) -> None:
        """Fold one parsed chunk in (``span``: its prompt ids, cut out by loads_split)."""
        if chunk.get("model") and not self.out.model:
            self.out.model = str(chunk["model"])
        if span is not None:
            if self._prompt is None and self.prompt_span is None:
                self.prompt_span = span
        else:
            p = _prompt_ids(chunk)
            if isinstance(p, list) and self._prompt is None and self.prompt_span is None:
                self._prompt = p
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.out.usage = {k: int(v) for k, v in usage.items() if isinstance(v, int)}
        for ch in chunk.get("choices") or ():
            idx = int(ch.get("index", 0))
            c = self._choices.get(idx)
            if c is None:
                c = self._choices[idx] = Choice(index=idx)
            delta = ch.get("delta") or {}
            if isinstance(delta.get("content"), str):
                c.content = (c.content or "") + delta["content"]
            r = delta.get("reasoning_content", delta.get("reasoning"))
            if isinstance(r, str):
                c.reasoning = (c.reasoning or "") + r
            for tc in delta.get("tool_calls") or ():
                slot = self._tcs.setdefault(idx, {}).setdefault(
                    int(tc.get("index", 0)), {"id": "", "name": "", "arguments": ""})
                if tc.get("id"):
                    slot["id"] = str(tc["id"])
                fn = tc.get("function") or {}
                if fn.get("name"):
                    slot["name"] += str(fn["name"])
                if fn.get("arguments"):
                    slot["arguments"] += str(fn["arguments"])
            ids, lps = _from_logprobs(ch)
            if isinstance(ch.get("token_ids"), list):
                ids = [int(t) for t in ch["token_ids"]]
            if ids is not None:
                _checked(ids)
                if c.token_ids is None:
                    c.token_ids = []
                c.token_ids.extend(ids)
            if lps is not None:
                if c.logprobs is None:
                    c.logprobs = []
                c.logprobs.extend(lps)
            if ch.get("finish_reason"):
                c.finish_reason = ch["finish_reason"]

    def finish(self) -> Outcome:
        """The accumulated outcome."""
        for idx, slots in self._tcs.items():
            self._choices[idx].tool_calls = [
                ToolCall(id=s["id"], name=s["name"], arguments=s["arguments"])
                for _, s in sorted(slots.items())
            ]
        self.out.choices = [self._choices[i] for i in sorted(self._choices)]
        ids = as_ids(self._prompt)
        self.out.prompt = None if ids is None else PromptIds(full=ids)
        return self.out
