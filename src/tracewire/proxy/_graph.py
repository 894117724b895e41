"""The matching index over one trace's message graph (what the match and commit steps of a
turn read and extend; see ``_match`` and ``_commit``).

Each node carries a digest of its message's canonical form (``Node.digest``); a dict maps
``(parent, digest) -> child`` so a request's messages are matched in O(messages). Harnesses
resend the whole history every turn, so a second dict maps ``(parent, raw JSON bytes of a
message) -> child``: messages seen before are matched by their bytes (a dict lookup, hashed
and compared in C) without decoding them; only new messages are decoded and canonically
digested. The bytes themselves are the key, not a digest of them: no hash object per message,
and no collision can ever match a different message. A committed plain-text answer is also
indexed under the compact form most harnesses resend it in (``alias_answer``), so the next
request finds it undecoded too.
Per-node path bookkeeping (token count, contiguous span) makes the "does the prompt extend
the matched path" check a single array comparison instead of a walk to the root.
"""

from __future__ import annotations

from array import array
from typing import Any

import numpy as np
import orjson
from numpy.typing import NDArray

from ..trace import Trace, message_digest
from ._prompt import PromptCache, PromptIds
from ._turn_types import NewMessage, RequestCache

__all__ = ["TurnGraph"]


class TurnGraph:
    """Matching index over one trace's message graph; the proxy adds nodes only through
    :meth:`add`, so the index never misses one."""

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

    def match_fast(self, raws: list[bytes], parent: int | None = None
                   ) -> tuple[int | None, int]:
        """Follow the raw-bytes keys of ``raws`` from ``parent`` (default: the root);
        returns (parent, messages matched)."""
        fast = self._fast
        k = 0
        for raw in raws:
            child = fast.get((parent, raw))
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

    def materialize(self, prompt: PromptIds) -> NDArray[np.int32]:
        """The prompt's full ids (O(prompt); only on a mismatch or a foreign base)."""
        if prompt.full is not None:
            return prompt.full
        _, ok, base = self.path_ids(prompt.base)
        assert ok and base is not None  # a cached base always has tokens
        return np.concatenate([base, np.frombuffer(prompt.tail, dtype=np.int32)])

    def segment(self, base: int, base_len: int, node: int | None) -> bytes | None:
        """The int32 bytes of the ids on the path from ``base`` (exclusive) down to
        ``node``, or None when ``base`` is not on the path of ``node``. Walks only the nodes
        past ``base``."""
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
        cols = self.trace.columns
        if len(parts) == 1:
            return cols.ids_bytes(*parts[0])
        return b"".join([cols.ids_bytes(a, b) for a, b in reversed(parts)])

    def extension(self, node: int | None, prompt: PromptIds, has_new: bool
                  ) -> NDArray[np.int32] | array[int] | None:
        """The prompt's ids past the path of ``node`` when the prompt extends that path
        (and only equals it when there is no new message); None on a mismatch."""
        plen, ok = (0, True) if node is None else (self._plen[node], self._pok[node])
        n = len(prompt)
        if not ok or n < plen or (not has_new and n != plen):
            return None
        if prompt.full is None and prompt.base is not None:
            seg = self.segment(prompt.base, prompt.base_len, node)
            if seg is not None:
                # The first base_len ids are the path of base (memcmp'd as text); compare
                # only what the path adds after base (int32 bytes: no numpy call).
                k = len(seg) // 4
                tail = prompt.tail
                return tail[k:] if tail[:k].tobytes() == seg else None
        full = self.materialize(prompt)
        _, _, pids = self.path_ids(node)
        if pids is None or not np.array_equal(full[:plen], pids):
            return None
        return full[plen:]

    def alias_answer(self, node: int) -> None:
        """Index the bytes a harness most often resends the plain-text answer at ``node`` as
        (the compact JSON of a dict of its role and content, as orjson and the openai SDK
        write it), so the next request matches it by its bytes without decoding it. Only an
        alias of the same canonical message: a resend in any other form is decoded and
        digested as before."""
        nd = self.trace.nodes[node]
        m = nd.message
        if m.tool_calls or not isinstance(m.content, str) or m.tool_call_id or m.name:
            return
        self._fast[(nd.parent, orjson.dumps({"role": m.role, "content": m.content}))] = node

    def depth(self, node: int | None) -> int:
        """Messages on the path ending at ``node``."""
        d = 0
        nodes = self.trace.nodes
        while node is not None:
            d += 1
            node = nodes[node].parent
        return d

    def add(
        self, nm: NewMessage, parent: int | None, *, sampled: bool = False,
        ids: Any = None, logprobs: Any = None, has_tokens: bool = True,
    ) -> int:
        """Append ``nm`` under ``parent`` to the trace and index it; returns its node."""
        i = self.trace.add_node(
            nm.message, parent=parent, sampled=sampled, ids=ids, logprobs=logprobs,
            has_tokens=has_tokens, digest=nm.digest,
        )
        self._children[(parent, nm.digest)] = i
        if nm.raw is not None:
            self._fast[(parent, nm.raw)] = i
        self._index(i)
        return i
