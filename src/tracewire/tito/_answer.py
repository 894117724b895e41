"""What :class:`~tracewire.tito.TokenUpstream` answers the proxy: a chat completion (or its
chunks) in vLLM's token-field shape, built from a :class:`~tracewire.tito.codecs.Generation`.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from ._codecs import Generation
from ._parse import ParsedCompletion
from ._stream import EventKind

__all__ = ["chat_reply", "delta_of", "finish_of", "stream_chunk"]


def finish_of(gen: Generation, parsed: ParsedCompletion) -> str:
    """The chat finish reason: ``tool_calls`` when a stop-ended completion parsed into
    calls, else the server's reason (``stop`` when it gave none)."""
    if gen.finish_reason == "stop" and parsed.tool_calls:
        return "tool_calls"
    return gen.finish_reason or "stop"


def _content(ids: list[int], lps: list[float]) -> list[dict[str, Any]]:
    return [{"token": f"token_id:{i}", "logprob": lp, "bytes": None, "top_logprobs": []}
            for i, lp in zip(ids, lps, strict=True)]


def chat_reply(model: str, prompt: list[int], parsed: ParsedCompletion, gen: Generation,
               *, logprobs: bool = True) -> dict[str, Any]:
    """The ``chat.completion`` for one turn: the prompt ids sent and the sampled ids, with
    their logprobs as ``logprobs.content`` unless ``logprobs`` is false (then null)."""
    return {
        "id": "chatcmpl-" + uuid.uuid4().hex, "object": "chat.completion",
        "created": int(time.time()), "model": model,
        "prompt_token_ids": prompt,
        "choices": [{"index": 0, "message": parsed.as_message(),
                     "finish_reason": finish_of(gen, parsed), "token_ids": gen.ids,
                     "logprobs": {"content": _content(gen.ids, gen.logprobs)}
                     if logprobs else None}],
        "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(gen.ids),
                  "total_tokens": len(prompt) + len(gen.ids)},
    }


def stream_chunk(model: str, cid: str, delta: dict[str, Any], ids: list[int],
                 lps: list[float], finish: str | None, prompt: list[int] | None,
                 usage: dict[str, int] | None = None) -> dict[str, Any]:
    """One ``chat.completion.chunk``: ``delta`` and the ids (with logprobs) it adds;
    ``prompt_token_ids`` on the first."""
    ch: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish,
                          "token_ids": ids, "logprobs": {"content": _content(ids, lps)}}
    d: dict[str, Any] = {"id": cid, "object": "chat.completion.chunk",
                         "created": int(time.time()), "model": model, "choices": [ch]}
    if prompt is not None:
        d["prompt_token_ids"] = prompt
    if usage is not None:
        d["usage"] = usage
    return d


def delta_of(events: list[Any], n_calls: int) -> tuple[dict[str, Any], int]:
    """The chunk delta for the stream parser's ``events`` (content, reasoning, whole tool
    calls numbered from ``n_calls``) and the new call count."""
    delta: dict[str, Any] = {}
    for e in events:
        if e.kind == EventKind.CONTENT:
            delta["content"] = delta.get("content", "") + e.text
        elif e.kind == EventKind.REASONING:
            delta["reasoning_content"] = delta.get("reasoning_content", "") + e.text
        elif e.call is not None:
            delta.setdefault("tool_calls", []).append({"index": n_calls, **e.call.as_openai()})
            n_calls += 1
    return delta, n_calls
