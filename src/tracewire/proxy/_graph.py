"""Incremental matching of request messages against a trace's message graph, and commits.

Each node carries a digest of its message's canonical form (``Node.digest``); a dict maps
``(parent, digest) -> child`` so a request's messages are matched in O(messages). Harnesses
resend the whole history every turn, so a second dict maps ``(parent, hash of the raw JSON
bytes of a message) -> child``: messages seen before are matched by hashing their bytes (C
speed) without decoding them; only new messages are decoded and canonically digested.
Per-node path bookkeeping (token count, contiguous span) makes the "does the prompt extend
the matched path" check a single array comparison instead of a walk to the root.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
from numpy.typing import NDArray

from ..trace import Call, InfoKey, Message, ToolCall, Trace, message_digest
from ._prompt import PromptCache, PromptIds
from ._rawjson import RawSpan

__all__ = ["Choice", "NewMessage", "Outcome", "Prepared", "RequestCache", "TurnGraph",
           "chat_message", "raw_hash"]


def raw_hash(raw: bytes) -> bytes:
    """Hash of a message's raw JSON bytes (the fast-path key)."""
    return hashlib.blake2b(raw, digest_size=16).digest()


def chat_message(d: Any) -> Message:
    """A :class:`Message` from an OpenAI chat message dict (``ValueError`` if malformed)."""
    if not isinstance(d, dict) or not isinstance(d.get("role"), str):
        raise ValueError("each message must be an object with a string 'role'")
    content = d.get("content")
    if content is not None and not isinstance(content, str | list):
        raise ValueError("message content must be a string, a list of parts, or null")
    tool_calls = None
    raw_tcs = d.get("tool_calls")
    if raw_tcs:
        if not isinstance(raw_tcs, list):
            raise ValueError("tool_calls must be a list")
        tool_calls = []
        for tc in raw_tcs:
            fn = tc.get("function") if isinstance(tc, dict) else None
            if not isinstance(fn, dict):
                raise ValueError("each tool call needs a 'function' object")
            args = fn.get("arguments", "")
            tool_calls.append(
                ToolCall(
                    id=str(tc.get("id") or ""),
                    name=str(fn.get("name") or ""),
                    arguments=args if isinstance(args, str) else orjson.dumps(args).decode(),
                    type=str(tc.get("type") or "function"),
                )
            )
    reasoning = d.get("reasoning_content", d.get("reasoning"))
    return Message(
        role=d["role"],
        content=content,
        tool_calls=tool_calls,
        tool_call_id=d.get("tool_call_id"),
        name=d.get("name"),
        reasoning=reasoning if isinstance(reasoning, str) else None,
    )


@dataclass(slots=True, frozen=True)
class RequestCache:
    """The last committed chat request's messages array (raw text, by reference), the node
    whose path holds exactly those messages, and a hash state over their raw hashes."""

    raw: RawSpan
    stop: int  # raw.data[raw.start:stop] is the array text before its closing bracket
    node: int
    hasher: Any  # hashlib.blake2b state after every message's raw hash


@dataclass(slots=True)
class NewMessage:
    """A request message not found in the graph yet."""

    message: Message
    digest: str
    raw: bytes | None  # raw-bytes hash for the fast path, when the dialect has one


@dataclass(slots=True)
class Prepared:
    """Result of matching a request: the matched parent and the messages to append."""

    parent: int | None
    new: list[NewMessage]
    hashes: list[bytes] = field(default_factory=list)  # raw hashes of every message


@dataclass(slots=True)
class Choice:
    """One completion as accumulated from the upstream (streamed or not)."""

    index: int = 0
    content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None

    def message(self) -> Message:
        """The assistant message this completion is."""
        return Message(
            role="assistant",
            content=self.content,
            tool_calls=list(self.tool_calls) or None,
            reasoning=self.reasoning,
        )


@dataclass(slots=True)
class Outcome:
    """What the upstream answered: model, prompt ids (if any), choices, usage."""

    model: str = ""
    prompt: PromptIds | None = None
    #: Where the prompt ids lie in the upstream's raw body when the parsed dict holds the
    #: placeholder instead (see ``_rawjson``).
    span: RawSpan | None = None
    choices: list[Choice] = field(default_factory=list)
    usage: dict[str, int] = field(default_factory=dict)


class TurnGraph:
    """Matching index over one trace's message graph; the proxy's only writer of it."""

    __slots__ = ("_children", "_fast", "_plen", "_pok", "_pspan", "prompt_cache",
                 "request_cache", "trace")

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        #: The last committed prompt's raw ids text and node (see ``_prompt``).
        self.prompt_cache: PromptCache | None = None
        #: The last committed chat request's raw messages text and node (see ``_dialect``).
        self.request_cache: RequestCache | None = None
        self._children: dict[tuple[int | None, str], int] = {}
        self._fast: dict[tuple[int | None, bytes], int] = {}
        self._plen: list[int] = []
        self._pok: list[bool] = []
        self._pspan: list[tuple[int, int]] = []  # contiguous path span, (-1, -1) if none
        for i, node in enumerate(trace.nodes):
            digest = node.digest or message_digest(node.message)
            self._children[(node.parent, digest)] = i
            self._index(i)

    def _index(self, i: int) -> None:
        node = self.trace.nodes[i]
        p = node.parent
        n = node.end - node.start
        if p is None:
            plen, ok, span = n, node.has_tokens, (node.start, node.end)
        else:
            plen, ok, span = self._plen[p] + n, self._pok[p] and node.has_tokens, self._pspan[p]
            if n:
                if self._plen[p] == 0:
                    span = (node.start, node.end)
                elif span[0] >= 0 and span[1] == node.start:
                    span = (span[0], node.end)
                else:
                    span = (-1, -1)
        self._plen.append(plen)
        self._pok.append(ok)
        self._pspan.append(span)

    # -- matching ------------------------------------------------------------------------
    def match_fast(self, hashes: list[bytes], parent: int | None = None
                   ) -> tuple[int | None, int]:
        """Follow raw-hash aliases from ``parent`` (default: the root); returns (parent,
        messages matched)."""
        fast = self._fast
        k = 0
        for h in hashes:
            child = fast.get((parent, h))
            if child is None:
                break
            parent = child
            k += 1
        return parent, k

    def match_rest(
        self, parent: int | None, rest: list[NewMessage]
    ) -> tuple[int | None, list[NewMessage]]:
        """Continue matching decoded messages by canonical digest; returns the new tail."""
        children = self._children
        for j, nm in enumerate(rest):
            child = children.get((parent, nm.digest))
            if child is None:
                return parent, rest[j:]
            if nm.raw is not None:
                self._fast[(parent, nm.raw)] = child
            parent = child
        return parent, []

    def path_ids(self, node: int | None) -> tuple[int, bool, NDArray[np.int32] | None]:
        """(token count, all nodes have tokens, ids) of the path ending at ``node``."""
        if node is None:
            return 0, True, np.empty(0, dtype=np.int32)
        plen, ok = self._plen[node], self._pok[node]
        if not ok:
            return plen, False, None
        s, e = self._pspan[node]
        if plen == 0:
            return 0, True, np.empty(0, dtype=np.int32)
        if s >= 0:
            return plen, True, self.trace.columns.ids[s:e]
        return plen, True, self.trace.branch(node).ids

    def _materialize(self, prompt: PromptIds) -> NDArray[np.int32]:
        """The prompt's full ids (O(prompt); only on a mismatch or a foreign base)."""
        if prompt.full is not None:
            return prompt.full
        _, ok, base = self.path_ids(prompt.base)
        assert ok and base is not None  # a cached base always has tokens
        return np.concatenate([base, prompt.tail])

    def _segment(self, base: int, base_len: int, node: int | None
                 ) -> NDArray[np.int32] | None:
        """Ids of the path from ``base`` (exclusive) down to ``node``, or None when ``base``
        is not on the path of ``node``. Walks only the nodes past ``base``."""
        nodes = self.trace.nodes
        parts: list[tuple[int, int]] = []
        x = node
        while x is not None and x != base:
            if x < base or self._plen[x] < base_len:
                return None  # parents have lower indices: base is not above node
            nd = nodes[x]
            if nd.end > nd.start:
                parts.append((nd.start, nd.end))
            x = nd.parent
        if x != base:
            return None
        ids = self.trace.columns.ids
        if not parts:
            return ids[:0]
        if len(parts) == 1:
            return ids[parts[0][0]:parts[0][1]]
        return np.concatenate([ids[a:b] for a, b in reversed(parts)])

    def _extension(self, node: int | None, prompt: PromptIds, has_new: bool
                   ) -> NDArray[np.int32] | None:
        """The prompt's ids past the path of ``node`` when the prompt extends that path
        (and only equals it when there is no new message); None on a mismatch."""
        plen, ok = (0, True) if node is None else (self._plen[node], self._pok[node])
        n = len(prompt)
        if not ok or n < plen or (not has_new and n != plen):
            return None
        if prompt.full is None and prompt.base is not None:
            seg = self._segment(prompt.base, prompt.base_len, node)
            if seg is not None:
                # The first base_len ids are the path of base (memcmp'd as text); compare
                # only what the path adds after base.
                k = seg.shape[0]
                tail = prompt.tail
                return tail[k:] if np.array_equal(tail[:k], seg) else None
        full = self._materialize(prompt)
        _, _, pids = self.path_ids(node)
        if pids is None or not np.array_equal(full[:plen], pids):
            return None
        return full[plen:]

    def _depth(self, node: int | None) -> int:
        """Messages on the path ending at ``node``."""
        d = 0
        nodes = self.trace.nodes
        while node is not None:
            d += 1
            node = nodes[node].parent
        return d

    def _rewritten_from(self, parent: int | None, new: list[NewMessage], prompt: PromptIds
                        ) -> tuple[int | None, NDArray[np.int32]] | None:
        """When the request dropped a sampled answer from its history (the matched node
        was a turn's prompt, and the request goes on with another message instead of that
        answer): the deepest ancestor of ``parent`` whose tokens the prompt extends and the
        prompt's ids past it. None for a real mismatch (re-tokenized history)."""
        if parent is None or not new or new[0].message.role == "assistant":
            return None
        trace = self.trace
        if not any(c.prompt_node == parent and c.node is not None for c in trace.calls):
            return None
        node: int | None = trace.nodes[parent].parent
        while True:
            ext = self._extension(node, prompt, True)
            if ext is not None:
                return node, ext
            if node is None:
                return None
            node = trace.nodes[node].parent

    def _add(
        self, nm: NewMessage, parent: int | None, *, sampled: bool = False,
        ids: Any = None, logprobs: Any = None, has_tokens: bool = True,
    ) -> int:
        i = self.trace.add_node(
            nm.message, parent=parent, sampled=sampled, ids=ids, logprobs=logprobs,
            has_tokens=has_tokens, digest=nm.digest,
        )
        self._children[(parent, nm.digest)] = i
        if nm.raw is not None:
            self._fast[(parent, nm.raw)] = i
        self._index(i)
        return i

    # -- commit --------------------------------------------------------------------------
    def commit(
        self, prep: Prepared, out: Outcome, call: Call,
        all_messages: Callable[[], list[NewMessage]],
    ) -> list[int]:
        """Append a turn's new prompt nodes, one completion node per choice, and one Call
        per choice; returns the completion node indices. Runs without awaiting, so a turn
        is committed whole or not at all."""
        parent, new = self.match_rest(prep.parent, prep.new)
        prompt = out.prompt
        trace = self.trace
        if prompt is None:
            for nm in new:
                parent = self._add(nm, parent, has_tokens=False)
        else:
            rest = self._extension(parent, prompt, bool(new))
            if rest is not None:
                for j, nm in enumerate(new):
                    last = j == len(new) - 1
                    parent = self._add(nm, parent, ids=rest if last else rest[:0])
            else:
                full = self._materialize(prompt)
                base = self._rewritten_from(parent, new, prompt)
                if base is None:
                    # Re-tokenized history: the whole request becomes a new root.
                    trace.info[InfoKey.TOKEN_MISMATCHES] = int(
                        trace.info.get(InfoKey.TOKEN_MISMATCHES, 0)) + 1
                    start, rest_ids, every = None, full, all_messages()
                else:
                    trace.info[InfoKey.HISTORY_REWRITES] = int(
                        trace.info.get(InfoKey.HISTORY_REWRITES, 0)) + 1
                    start, rest_ids = base
                    every = all_messages()[self._depth(start):]
                parent = start
                for j, nm in enumerate(every):
                    last = j == len(every) - 1
                    parent = self._add(nm, parent, ids=rest_ids if last else rest_ids[:0])
            if prompt.raw is not None and parent is not None and len(prompt):
                # The path of ``parent`` now holds exactly this prompt's ids.
                self.prompt_cache = PromptCache(prompt.raw, prompt.raw.content_end(), parent,
                                                len(prompt))
        nodes: list[int] = []
        for ch in out.choices:
            msg = ch.message()
            nm = NewMessage(msg, message_digest(msg), None)
            ids = ch.token_ids
            lps = ch.logprobs if ch.logprobs is not None and ids is not None and len(
                ch.logprobs) == len(ids) else None
            node = self._add(
                nm, parent, sampled=True, ids=ids, logprobs=lps, has_tokens=ids is not None
            )
            nodes.append(node)
            c = Call(
                model=out.model or call.model, endpoint=call.endpoint, sampling=call.sampling,
                finish_reason=ch.finish_reason, usage=dict(out.usage), span=call.span,
                node=node, prompt_node=parent, hooks=call.hooks, flags=call.flags,
            )
            trace.add_call(c)
        trace.pending = []
        trace.notify()
        return nodes

    def fail(self, call: Call, error: str, prompt_node: int | None = None) -> None:
        """Record a failed call (no completion node) made from ``prompt_node`` (the deepest
        node its request matched, None when unknown) and an error; nothing else is
        appended."""
        self.trace.add_call(
            Call(model=call.model, endpoint=call.endpoint, sampling=call.sampling,
                 span=call.span, error=error, hooks=call.hooks, finish_reason="error",
                 prompt_node=prompt_node, flags=call.flags)
        )
        self.trace.add_error("proxy", error, phase="agent")
        self.trace.pending = []
        self.trace.notify()
