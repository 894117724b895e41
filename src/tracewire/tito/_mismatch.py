"""How a branch's recorded ids differ from a canonical render of its final conversation.

Token-in/token-out keeps the sampled ids, so differences from a full re-render are expected;
what matters is where they are. Each differing stretch is classified:

- ``special``: special tokens differ in count or type (a lost or doubled close token, a
  missing BOS) — a template or bridge bug;
- ``prompt_text``: text the model did not sample differs (a junction, a role header, a tool
  result) — a template or bridge bug;
- ``assistant_text``: text the model sampled renders differently (re-serialized tool-call
  arguments, stripped ``<think>``, trimmed whitespace) — benign;
- ``retokenized``: the same text as other ids (a non-canonical sampled tokenization) —
  benign.

:func:`mismatch_report` is plain CPU work (a sequence diff and decodes): run it in a thread,
never on the event loop.
"""

from __future__ import annotations

import difflib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from ..tokens import chat_messages
from ._render import PromptBuilder

__all__ = ["Difference", "DifferenceKind", "MismatchReport", "mismatch_report"]


class DifferenceKind(StrEnum):
    """The class of one differing stretch (see module docstring)."""

    SPECIAL = "special"
    PROMPT_TEXT = "prompt_text"
    ASSISTANT_TEXT = "assistant_text"
    RETOKENIZED = "retokenized"


BENIGN = frozenset({DifferenceKind.ASSISTANT_TEXT, DifferenceKind.RETOKENIZED})


@dataclass(slots=True)
class Difference:
    """One differing stretch: ``recorded[r0:r1]`` versus ``canonical[c0:c1]``."""

    kind: DifferenceKind
    r0: int
    r1: int
    c0: int
    c1: int
    recorded_text: str
    canonical_text: str
    special_delta: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class MismatchReport:
    """All differences of one branch; :attr:`mismatch` counts the non-benign ones (the
    figure reported as ``tito_mismatch``)."""

    recorded_tokens: int
    canonical_tokens: int
    differences: list[Difference] = field(default_factory=list)  # the first max_examples
    by_kind: Counter[str] = field(default_factory=Counter)  # all of them

    @property
    def mismatch(self) -> int:
        """Differences that point at a template or bridge bug."""
        return sum(n for k, n in self.by_kind.items() if DifferenceKind(k) not in BENIGN)

    def counts(self) -> dict[str, int]:
        """Differences by kind."""
        return dict(self.by_kind)

    def summary(self) -> dict[str, Any]:
        """A JSON-able summary for session and eval reports."""
        return {"mismatch": self.mismatch, "by_kind": self.counts(),
                "recorded_tokens": self.recorded_tokens,
                "canonical_tokens": self.canonical_tokens}


def mismatch_report(builder: PromptBuilder, recorded: Sequence[int], sampled: Sequence[bool],
                    messages: Sequence[dict[str, Any]], tools: Sequence[Any] | None = None,
                    *, max_examples: int = 1000) -> MismatchReport:
    """Compare ``recorded`` ids (``sampled[i]`` true where the model sampled id ``i``) with a
    canonical render of ``messages`` (the branch's whole conversation, no generation
    prompt)."""
    if len(sampled) != len(recorded):
        raise ValueError("sampled mask and recorded ids differ in length")
    tok = builder.tok
    canon = tok.encode(tok.render(chat_messages(messages), tools))
    junction = tok.encode(builder.family.junction) if builder.family.junction else []
    if junction and recorded and sampled[-1] and canon[-len(junction):] == junction \
            and list(recorded[-len(junction):]) != junction:
        # The template closes the last turn with its junction; a branch ends at the
        # sampled close token. Not a difference.
        canon = canon[:-len(junction)]
    special_ids = {v: k for k, v in tok.special.items()}
    rep = MismatchReport(len(recorded), len(canon))
    sm = difflib.SequenceMatcher(a=list(recorded), b=canon, autojunk=False)
    for op, r0, r1, c0, c1 in sm.get_opcodes():
        if op == "equal":
            continue
        rs = Counter(special_ids[i] for i in recorded[r0:r1] if i in special_ids)
        cs = Counter(special_ids[i] for i in canon[c0:c1] if i in special_ids)
        rt, ct = tok.decode(recorded[r0:r1]), tok.decode(canon[c0:c1])
        in_sampled = any(sampled[r0:r1]) if r1 > r0 else (
            (r0 > 0 and sampled[r0 - 1]) or (r0 < len(sampled) and sampled[r0]))
        delta = {k: rs[k] - cs[k] for k in set(rs) | set(cs) if rs[k] != cs[k]}
        if delta:
            kind = DifferenceKind.SPECIAL
        elif rt == ct:
            kind = DifferenceKind.RETOKENIZED
        elif in_sampled:
            kind = DifferenceKind.ASSISTANT_TEXT
        else:
            kind = DifferenceKind.PROMPT_TEXT
        rep.by_kind[kind.value] += 1
        if len(rep.differences) < max_examples:
            rep.differences.append(Difference(kind, r0, r1, c0, c1, rt, ct, delta))
    return rep
