"""One conversation's prompts, turn after turn: resolve the history, bridge or re-render,
then record what was sampled.

This is the whole token-in/token-out prompt path without any I/O: the upstream (or a test)
calls :meth:`TokenSession.plan` with a request's messages and tools, sends
:attr:`Plan.prompt_ids` to the model server, and calls :meth:`TokenSession.commit` with the
assistant message it returns and the sampled ids.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ._errors import BridgeError
from ._history import Continuation, ConversationIndex, RecordedTurn, RerenderReason
from ._render import PromptBuilder, Rendered

__all__ = ["Plan", "TokenSession"]


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

    def plan(self, messages: Sequence[dict[str, Any]], tools: Sequence[Any] | None = None
             ) -> Plan:
        """Resolve ``messages`` against what was recorded and build the prompt."""
        cont = self.index.resolve(messages)
        if cont.kind == "same" and cont.turn is not None:
            plan = Plan(cont, cont.turn, None, messages)
            plan.point = cont.turn
            return plan
        base = cont.turn
        if cont.kind == "bridge" and base is not None:
            try:
                r = self.builder.bridge(base.last_id if base.ended_by_stop else None,
                                        base.length, cont.new, tools)
            except BridgeError:
                cont = Continuation("full", None, messages, RerenderReason.TEMPLATE, cont.chain)
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
        plan.point = self.index.new_branch(r.ids)
        return plan

    def commit(self, plan: Plan, assistant: dict[str, Any], completion: Sequence[int],
               ended_by_stop: bool) -> RecordedTurn:
        """Record the turn ``plan`` was sent for: the ``assistant`` message returned to the
        harness and the ``completion`` ids sampled (``ended_by_stop`` false when cut by
        length)."""
        return self.index.record(plan.messages, plan.continuation.chain, plan.point,
                                 assistant, completion, ended_by_stop)
