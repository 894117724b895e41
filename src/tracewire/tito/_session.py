"""One conversation's prompts, turn after turn: resolve the history, bridge or re-render,
then record what was sampled.

This is the whole token-in/token-out prompt path without any I/O: the upstream (or a test)
calls :meth:`TokenSession.plan` with a request's messages and tools, sends
:attr:`Plan.prompt_ids` to the model server, and calls :meth:`TokenSession.commit` with the
assistant message it returns and the sampled ids.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
from numpy.typing import NDArray

from ._errors import BridgeError
from ._history import (
    Continuation,
    ContinuationKind,
    ConversationIndex,
    IdBuffer,
    RecordedTurn,
    RerenderReason,
    tools_key,
)
from ._render import PromptBuilder, Rendered

__all__ = ["BranchTip", "Plan", "TokenSession"]

#: Branches whose tools a session remembers (re-renders are rare; the newest matter).
MAX_BRANCH_TOOLS = 256


@dataclass(slots=True)
class Plan:
    """A turn's prompt: the point it extends (``base``, None for a new branch), what it adds
    (``rendered``), and how the history was resolved."""

    continuation: Continuation
    base: RecordedTurn | None
    rendered: Rendered | None
    messages: Sequence[dict[str, Any]]
    point: RecordedTurn = field(init=False)

    @property
    def prompt_ids(self) -> list[int]:
        """The ids to send (a copy)."""
        return self.point.ids()

    @property
    def new_branch(self) -> bool:
        """Whether this turn opens a branch (first turn or re-render)."""
        return self.base is None

    @property
    def reason(self) -> RerenderReason | None:
        """Why the history was re-rendered (None for a first turn or a bridge)."""
        return self.continuation.reason


class TokenSession:
    """Prompt ids for one conversation (see module docstring); ``rerenders`` counts full
    re-renders by reason."""

    def __init__(self, builder: PromptBuilder, index: ConversationIndex | None = None) -> None:
        self.builder = builder
        self.index = index or ConversationIndex()
        self.rerenders: Counter[str] = Counter()
        self.bridges = 0
        #: The tools (:func:`tools_key`) the last turn planned by :meth:`plan_on` used.
        self.last_tools: bytes | None = None
        # (length, digest of the ids, tools key) of each branch's first prompt, newest last:
        # which tools a recorded branch was rendered with (the trace does not keep tools).
        self._branch_tools: list[tuple[int, bytes, bytes]] = []

    def _new_branch(self, ids: list[int], key: bytes) -> RecordedTurn:
        self._branch_tools.append((len(ids), _digest(ids), key))
        del self._branch_tools[:-MAX_BRANCH_TOOLS]
        return self.index.new_branch(ids, key)

    def tools_of(self, ids: Sequence[int] | NDArray[np.int32]) -> Any:
        """The tools (a list, empty for none) the branch whose recorded ids are ``ids`` was
        rendered with (the newest branch whose first prompt they start with), None when
        unknown."""
        arr = np.asarray(ids)
        for n, digest, key in reversed(self._branch_tools):
            if len(arr) >= n and _digest(arr[:n]) == digest:
                return orjson.loads(key)
        return None

    def _tools_changed(self, before: bytes | None, now: bytes) -> bool:
        # Changed tools only matter where the template renders them: the recorded ids
        # hold the old tools block, which the model would keep seeing.
        return before is not None and self.builder.tools_render_differently(before, now)

    def plan(self, messages: Sequence[dict[str, Any]], tools: Sequence[Any] | None = None
             ) -> Plan:
        """Resolve ``messages`` against what was recorded and build the prompt."""
        key = tools_key(tools)
        cont = self.index.resolve(messages)
        if cont.turn is not None and self._tools_changed(cont.turn.tools, key):
            cont = Continuation(ContinuationKind.FULL, None, messages, RerenderReason.TOOLS_CHANGED,
                                cont.chain)
        if cont.kind == ContinuationKind.SAME and cont.turn is not None:
            plan = Plan(cont, cont.turn, None, messages)
            plan.point = cont.turn
            return plan
        base = cont.turn
        if cont.kind == ContinuationKind.BRIDGE and base is not None:
            try:
                r = self.builder.bridge(base.last_id if base.ended_by_stop else None,
                                        base.length, cont.new, tools)
            except BridgeError:
                cont = Continuation(ContinuationKind.FULL, None, messages,
                                    RerenderReason.TEMPLATE, cont.chain)
            else:
                self.bridges += 1
                plan = Plan(cont, base, r, messages)
                plan.point = base.extended(r.ids)
                return plan
        reason = cont.reason
        if reason is not None:
            self.rerenders[reason.value] += 1
        r = self.builder.render_full(messages, tools, reason=reason.value if reason else "")
        plan = Plan(cont, None, r, messages)
        plan.point = self._new_branch(r.ids, key)
        return plan

    def plan_on(self, messages: Sequence[dict[str, Any]], tools: Sequence[Any] | None, *,
                new: int, base_ids: Sequence[int] | None, base_sampled: bool,
                ended_by_stop: bool = True, recorded: bool = False,
                root_role: str | None = None) -> Plan:
        """The prompt for ``messages`` given what the proxy matched: the last ``new``
        messages are new, ``base_ids`` the recorded ids of the path the rest ends at
        (``base_sampled``: it ends at the echoed assistant's sampled ids). Bridges from
        those ids verbatim; otherwise re-renders whole with a reason (none for a first
        turn). Plans made here are not recorded in :attr:`index` (the trace is the record);
        a ``base_ids`` list becomes the plan's buffer (it is extended in place).
        """
        msgs = list(messages)
        new_msgs = msgs[len(msgs) - new:] if new else []
        key = tools_key(tools)
        before, self.last_tools = self.last_tools, key
        if base_ids is not None and self._tools_changed(before, key):
            # The matched ids were rendered with other tools: their tools block is stale.
            reason: RerenderReason | None = RerenderReason.TOOLS_CHANGED
        elif base_ids is not None:
            # A list is taken over, not copied (the caller made it for this turn).
            buf = IdBuffer(base_ids if isinstance(base_ids, list) else list(base_ids))
            base = RecordedTurn(buf, len(buf.ids), ended_by_stop)
            if not new_msgs and not base_sampled and base.length:
                plan = Plan(Continuation(ContinuationKind.SAME, base), base, None, msgs)
                plan.point = base
                return plan
            if base_sampled and new_msgs:
                try:
                    r = self.builder.bridge(base.last_id if ended_by_stop else None,
                                            base.length, new_msgs, tools)
                except BridgeError:
                    reason = RerenderReason.TEMPLATE
                else:
                    self.bridges += 1
                    bridged = Continuation(ContinuationKind.BRIDGE, base, new_msgs)
                    plan = Plan(bridged, base, r, msgs)
                    plan.point = base.extended(r.ids)
                    return plan
            else:
                reason = _why(msgs, new_msgs, base_sampled)
        elif not recorded:
            reason = None  # a first turn
        elif new == len(msgs):
            reason = (RerenderReason.SYSTEM_CHANGED
                      if msgs and msgs[0].get("role") == "system" == root_role
                      else RerenderReason.HISTORY_CHANGED)
        else:
            reason = _why(msgs, new_msgs, base_sampled)
        if reason is not None:
            self.rerenders[reason.value] += 1
        r = self.builder.render_full(msgs, tools, reason=reason.value if reason else "")
        plan = Plan(Continuation(ContinuationKind.FULL, None, msgs, reason), None, r, msgs)
        plan.point = self._new_branch(r.ids, key)
        return plan

    def commit(self, plan: Plan, assistant: dict[str, Any], completion: Sequence[int],
               ended_by_stop: bool) -> RecordedTurn:
        """Record the turn ``plan`` was sent for: the ``assistant`` message returned to the
        harness and the ``completion`` ids sampled (``ended_by_stop`` false when cut by
        length)."""
        return self.index.record(plan.messages, plan.continuation.chain, plan.point,
                                 assistant, completion, ended_by_stop)


def _digest(ids: Sequence[int] | NDArray[Any]) -> bytes:
    return hashlib.blake2b(np.asarray(ids, dtype=np.int64).tobytes(), digest_size=16).digest()


def _why(msgs: list[dict[str, Any]], new_msgs: list[dict[str, Any]], base_sampled: bool
         ) -> RerenderReason:
    """Why a history that matched part of the record cannot be bridged."""
    if not new_msgs:
        # The request ends inside the record: it dropped turns off the end.
        return RerenderReason.TRUNCATED
    first = new_msgs[0].get("role")
    if first == "assistant" or (not base_sampled and any(
            m.get("role") == "assistant" for m in new_msgs)):
        return RerenderReason.ASSISTANT_EDITED
    if first == "system":
        return RerenderReason.SYSTEM_CHANGED
    return RerenderReason.HISTORY_CHANGED


class BranchTip:
    """A session's last served branch as a Python list (prompt + completion ids) with a
    numpy mirror, lent to the next turn that extends it: behind the proxy each turn gets the
    matched branch's ids as a numpy array, and converting that to Python ints every turn
    costs O(tokens) object creation; checking it against the mirror is a memcmp."""

    __slots__ = ("arr", "ids")

    def __init__(self) -> None:
        self.ids: list[int] | None = None
        self.arr: NDArray[np.int32] | None = None

    def take(self, base: Sequence[int] | NDArray[np.int32] | None) -> list[int] | None:
        """A list of ``base``'s ids for the planner to own: the kept list when ``base`` is
        a prefix of it (the usual next turn, or a fork), else a conversion. The tip is lent
        out until :meth:`keep` (a concurrent turn of the session converts its own)."""
        if base is None:
            return None
        if not isinstance(base, np.ndarray):
            return list(base)
        ids, arr = self.ids, self.arr
        self.ids = self.arr = None
        n = len(base)
        if ids is not None and arr is not None and n <= len(arr) and np.array_equal(
                arr[:n], base):
            del ids[n:]  # a fork keeps only the shared prefix
            return ids
        out: list[int] = base.tolist()
        return out

    def keep(self, plan: Plan, base: Sequence[int] | NDArray[np.int32] | None,
             completion: Sequence[int]) -> None:
        """After the turn ``plan`` was sent for: its buffer + the ``completion`` ids become
        the tip (``base``: the array the plan was taken from)."""
        buf = plan.point.buffer.ids
        if len(buf) != plan.point.length:
            return  # not the buffer's tip (cannot happen for plan_on plans; be safe)
        added = np.asarray([*buf[len(base):], *completion], dtype=np.int32) if (
            isinstance(base, np.ndarray) and plan.base is not None) else None
        buf.extend(completion)
        self.arr = (np.concatenate([base, added]) if added is not None and isinstance(
            base, np.ndarray) else np.asarray(buf, dtype=np.int32))
        self.ids = buf
