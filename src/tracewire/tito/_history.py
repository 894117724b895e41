"""Which recorded turn a request's history continues, or why none can be continued.

Every turn served is recorded under the digest chain of its messages: the prompt's messages
(so an identical request — a retry, or one of a group's samples — reuses the same prompt
ids) and the prompt's messages plus the assistant message returned (so the next request,
which echoes that message back, continues from the sampled ids). Recorded ids live in one
growing buffer per branch: extending the branch's tip appends in place, extending an older
turn copies (a fork), so memory stays linear in tokens, never quadratic in turns.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson

from ..trace import chat_message_digest

__all__ = ["Continuation", "ContinuationKind", "ConversationIndex", "IdBuffer", "RecordedTurn",
           "RerenderReason", "message_digest", "tools_key"]


class RerenderReason(StrEnum):
    """Why a request could not continue a recorded branch (so it is re-rendered whole)."""

    SYSTEM_CHANGED = "system_changed"
    TOOLS_CHANGED = "tools_changed"  # the template renders the new tools differently
    ASSISTANT_EDITED = "assistant_edited"
    HISTORY_CHANGED = "history_changed"  # compaction, edited/dropped user or tool messages
    TRUNCATED = "truncated"  # the request drops messages off the end of the history
    TEMPLATE = "template"  # the template cannot render the new messages as a suffix


def message_digest(m: dict[str, Any]) -> bytes:
    """Digest of what makes two chat messages the same turn: ``trace``'s canonical one, the
    digest the proxy stores per node (reasoning excluded)."""
    return chat_message_digest(m)


def tools_key(tools: Sequence[Any] | None) -> bytes:
    """A request's tools as JSON (None and [] alike), keys in the order sent: templates
    serialize tools as given (``tojson`` keeps key order), so order is part of what the
    model sees; ``orjson.loads`` of the key gives the tools back in that order."""
    return orjson.dumps(list(tools or ()), option=orjson.OPT_NON_STR_KEYS)


def _chain(messages: Sequence[dict[str, Any]],
           cache: dict[bytes, bytes] | None = None) -> list[bytes]:
    out = []
    h = b""
    blake = hashlib.blake2b
    for m in messages:
        if cache is None:
            d = message_digest(m)
        else:
            # The harness resends the whole history: its raw JSON (one C call) finds the
            # canonical digest of a message seen before without canonicalizing it again.
            raw = orjson.dumps(m, option=orjson.OPT_NON_STR_KEYS)
            d = cache.get(raw) or b""
            if not d:
                d = cache[raw] = message_digest(m)
        h = blake(h + d, digest_size=16).digest()
        out.append(h)
    return out


class IdBuffer:
    """A branch's recorded ids, one growing list shared by the turns that extend it."""

    __slots__ = ("ids",)

    def __init__(self, ids: list[int]) -> None:
        self.ids = ids


@dataclass(slots=True, eq=False)
class RecordedTurn:
    """A point of a branch: the first ``length`` ids of ``buffer`` are what the model saw
    (and sampled) up to here; ``ended_by_stop`` is false for a length-cut completion;
    ``tools`` is the key (:func:`tools_key`) of the tools the branch was rendered with."""

    buffer: IdBuffer
    length: int
    ended_by_stop: bool = True
    branch: int = 0
    tools: bytes = b"[]"

    @property
    def last_id(self) -> int | None:
        """The last recorded id (None for an empty branch)."""
        return self.buffer.ids[self.length - 1] if self.length else None

    def ids(self) -> list[int]:
        """A copy of the recorded ids."""
        return self.buffer.ids[: self.length]

    def extended(self, added: Sequence[int], ended_by_stop: bool = True) -> RecordedTurn:
        """The point after ``added`` ids: appended in place at the tip, copied at a fork."""
        buf = self.buffer
        if len(buf.ids) != self.length:
            buf = IdBuffer(buf.ids[: self.length])
        buf.ids.extend(added)
        return RecordedTurn(buf, len(buf.ids), ended_by_stop, self.branch, self.tools)

    @staticmethod
    def root(ids: Sequence[int], branch: int, tools: bytes = b"[]") -> RecordedTurn:
        """A new branch starting with ``ids`` (rendered with the tools keyed ``tools``)."""
        return RecordedTurn(IdBuffer(list(ids)), len(ids), True, branch, tools)


class ContinuationKind(StrEnum):
    """How a request's prompt is built from the recorded turns."""

    #: Reuse the turn's prompt ids as they are.
    SAME = "same"
    #: The turn's ids plus the new messages rendered after them.
    BRIDGE = "bridge"
    #: Render everything.
    FULL = "full"


@dataclass(slots=True)
class Continuation:
    """How to build a request's prompt: ``same`` (reuse ``turn``'s prompt ids as they are),
    ``bridge`` (``turn`` + the ``new`` messages), or ``full`` (render everything; ``reason``
    is empty for a first turn, else why the history could not be continued)."""

    kind: ContinuationKind
    turn: RecordedTurn | None = None
    new: Sequence[dict[str, Any]] = ()
    reason: RerenderReason | None = None
    chain: Sequence[bytes] = ()


class ConversationIndex:
    """The recorded turns of one session (or one upstream), found by message digest chains.
    ``max_entries`` bounds the index (oldest entries go first). ``shared``: the index serves
    many conversations, so a history sharing nothing with them is a new one, not a
    re-render."""

    def __init__(self, max_entries: int = 200_000, *, shared: bool = False) -> None:
        self.max_entries = max_entries
        self.shared = shared
        self._prompts: dict[bytes, RecordedTurn] = {}
        self._ends: dict[bytes, RecordedTurn] = {}
        self._next_role: dict[bytes, str] = {}  # chain hash -> role of the message after it
        self._first_role: str | None = None
        self._branches = 0
        self._digests: dict[bytes, bytes] = {}

    def __len__(self) -> int:
        return len(self._ends)

    def resolve(self, messages: Sequence[dict[str, Any]]) -> Continuation:
        """The continuation for a request whose history is ``messages``."""
        if len(self._digests) > self.max_entries:
            self._digests.clear()
        chain = _chain(messages, self._digests)
        if chain and chain[-1] in self._prompts:
            return Continuation(ContinuationKind.SAME, self._prompts[chain[-1]], (), None, chain)
        for k in range(len(messages) - 1, 0, -1):
            if messages[k - 1].get("role") == "assistant" and chain[k - 1] in self._ends:
                return Continuation(ContinuationKind.BRIDGE, self._ends[chain[k - 1]],
                                    messages[k:], None, chain)
        return Continuation(ContinuationKind.FULL, None, messages, self._why(messages, chain),
                            chain)

    def _why(self, messages: Sequence[dict[str, Any]], chain: list[bytes]
             ) -> RerenderReason | None:
        if self._first_role is None:
            return None  # nothing recorded yet: a first turn, not a re-render
        common = 0
        for k, h in enumerate(chain):
            if h not in self._next_role and h not in self._ends and h not in self._prompts:
                break
            common = k + 1
        if self.shared and not any(m.get("role") == "assistant" for m in messages[:common]):
            # Many conversations share a system prompt or a first question: diverging before
            # any sampled turn is another conversation, not an edited one.
            return None
        if common == 0:
            if messages and messages[0].get("role") == "system" == self._first_role:
                return RerenderReason.SYSTEM_CHANGED
            return RerenderReason.HISTORY_CHANGED
        if common == len(messages):
            return RerenderReason.TRUNCATED
        expected = self._next_role.get(chain[common - 1])
        if expected == "assistant" or messages[common].get("role") == "assistant":
            return RerenderReason.ASSISTANT_EDITED
        if expected == "system" or messages[common].get("role") == "system":
            return RerenderReason.SYSTEM_CHANGED
        return RerenderReason.HISTORY_CHANGED

    def new_branch(self, ids: Sequence[int], tools: bytes = b"[]") -> RecordedTurn:
        """A new branch whose prompt is ``ids`` (a first turn or a re-render), rendered
        with the tools keyed ``tools``."""
        self._branches += 1
        return RecordedTurn.root(ids, self._branches - 1, tools)

    def record(self, messages: Sequence[dict[str, Any]], chain: Sequence[bytes],
               prompt: RecordedTurn, assistant: dict[str, Any], completion: Sequence[int],
               ended_by_stop: bool) -> RecordedTurn:
        """Record a served turn: ``prompt`` (the point holding the prompt ids of
        ``messages``), the ``assistant`` message returned and the ``completion`` ids sampled.
        Returns the point after the completion."""
        if len(self._ends) + len(self._prompts) >= self.max_entries:
            for d in (self._ends, self._prompts, self._next_role):
                for key in list(d)[: max(1, len(d) // 4)]:
                    del d[key]
        if not chain and messages:
            chain = _chain(messages, self._digests)
        if self._first_role is None and messages:
            self._first_role = str(messages[0].get("role"))
        for k in range(1, len(chain)):
            self._next_role.setdefault(chain[k - 1], str(messages[k].get("role")))
        end_hash = hashlib.blake2b((chain[-1] if chain else b"") + message_digest(assistant),
                                   digest_size=16).digest()
        if chain:
            self._prompts[chain[-1]] = prompt
            self._next_role.setdefault(chain[-1], "assistant")
        after = prompt.extended(completion, ended_by_stop)
        self._ends[end_hash] = after
        return after
