"""The same conversations through llama-server's own ``/v1/chat/completions``: the server
renders each turn's history with its template and re-tokenizes it, so the model's earlier
replies reach it again as their text's canonical ids. How often are those not the ids the
model sampled? Measured on the wire with ``json`` alone, and ``/tokenize`` of the reply.

The relay asks the chat endpoint for the per-token ids (``logprobs`` with one alternative)
and for untruncated sampling (as the token-in side sends it), nothing else.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from tracewire.compose import evaluate

from .relay import Record, Relay

CHAT = "/v1/chat/completions"


def chat_rewrite(path: str, body: dict[str, Any]) -> dict[str, Any]:
    """Ask for the sampled ids and sample untruncated (top_k/top_p/min_p neutral)."""
    if path != CHAT:
        return body
    return {**body, "logprobs": True, "top_logprobs": max(1, int(body.get("top_logprobs") or 0)),
            "top_k": 0, "top_p": 1.0, "min_p": 0.0}


@dataclass
class ChatTurn:
    """One chat reply: the ids the model sampled, the text the server returned for them."""

    ids: list[int]
    text: str
    finish: str
    tool_calls: bool


def chat_turns(records: list[Record]) -> list[ChatTurn]:
    """Every successful chat exchange, streamed or not, in order."""
    out = []
    for r in records:
        if r.path != CHAT or r.status != 200:
            continue
        stream = bool(json.loads(r.request).get("stream"))
        if stream:
            chunks = [json.loads(line[6:]) for line in r.response.decode().splitlines()
                      if line.startswith("data: ") and line != "data: [DONE]"]
        else:
            chunks = [json.loads(r.response)]
        ids: list[int] = []
        text, finish, calls = "", "", False
        for c in chunks:
            for choice in c.get("choices") or []:
                part = choice.get("delta") if stream else choice.get("message")
                part = part or {}
                text += part.get("content") or ""
                calls = calls or bool(part.get("tool_calls"))
                finish = choice.get("finish_reason") or finish
                ids += [e["id"] for e in (choice.get("logprobs") or {}).get("content") or []]
        out.append(ChatTurn(ids, text, finish, calls))
    return out


@dataclass
class Tally:
    """Turns whose reply re-tokenizes to other ids than were sampled, and their tokens."""

    turns: int = 0
    differ: int = 0
    tokens: int = 0
    tokens_differ: int = 0
    tool_call_turns: int = 0
    #: Turns whose sampled ids do not even decode to the text returned (the server changed
    #: the text itself: trimmed it, parsed something out of it).
    text_changed: int = 0
    examples: list[tuple[str, list[int], list[int]]] = field(default_factory=list)

    def add(self, other: Tally) -> None:
        self.turns += other.turns
        self.differ += other.differ
        self.tokens += other.tokens
        self.tokens_differ += other.tokens_differ
        self.tool_call_turns += other.tool_call_turns
        self.text_changed += other.text_changed
        self.examples += other.examples


async def _post(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> Any:
    async with http.post(url, json=body) as resp:
        resp.raise_for_status()
        return await resp.json()


def differing_tokens(a: list[int], b: list[int]) -> int:
    """Tokens outside the common prefix and suffix of ``a`` and ``b`` (the longer side)."""
    i = 0
    while i < min(len(a), len(b)) and a[i] == b[i]:
        i += 1
    j = 0
    while j < min(len(a), len(b)) - i and a[-1 - j] == b[-1 - j]:
        j += 1
    return max(len(a), len(b)) - i - j


async def retokenize(server: str, turns: list[ChatTurn]) -> Tally:
    """Re-tokenize each reply's text with the server's ``/tokenize`` (special tokens
    parsed, as a rendered history is) and compare with the sampled ids, the closing
    end-of-turn id left out. Tool-call turns are counted apart (their text is re-serialized
    by the server, so they are not a tokenization question)."""
    tally = Tally()
    async with aiohttp.ClientSession() as http:
        stops = set()
        for text in ("<|im_end|>", "<|endoftext|>"):
            got = (await _post(http, server + "/tokenize",
                               {"content": text, "parse_special": True}))["tokens"]
            if len(got) == 1:
                stops.add(got[0])
        for t in turns:
            if t.tool_calls:
                tally.tool_call_turns += 1
                continue
            sampled = t.ids[:-1] if t.ids and t.ids[-1] in stops else t.ids
            again = (await _post(http, server + "/tokenize",
                                 {"content": t.text, "parse_special": True}))["tokens"]
            tally.turns += 1
            tally.tokens += len(sampled)
            if again != sampled:
                tally.differ += 1
                back = (await _post(http, server + "/detokenize", {"tokens": sampled}))
                if back["content"] != t.text:
                    tally.text_changed += 1
                tally.tokens_differ += differing_tokens(sampled, again)
                if len(tally.examples) < 5:
                    tally.examples.append((t.text, sampled, again))
    return tally


async def chat_side(env: str, n: int | None, server: str, out: Path, *, seed: int,
                    temperature: float | None = None) -> Tally:
    """Run ``env`` through the chat pass-through proxy on ``server``'s own chat endpoint
    (with the relay between them) and tally its replies' re-tokenization."""
    async with Relay(server, rewrite=chat_rewrite) as relay:
        result = await evaluate(env, base_url=relay.url + "/v1", model="smollm", n=n,
                                concurrency=1, out=out, seed=seed, temperature=temperature)
        assert result.status == "complete" and result.reason is None
        turns = chat_turns(relay.records)
    assert turns, "nothing reached the chat endpoint"
    return await retokenize(server, turns)
