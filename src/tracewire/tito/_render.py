"""Prompt ids for a turn: a full render for a first turn, a bridge for every later one.

A later turn's prompt is the branch's recorded ids *verbatim* (prompt and sampled ids as the
model saw and produced them), then the family's junction, then a suffix rendered for the new
messages only. The suffix is rendered against a fixed dummy prefix: render(dummy + new,
generation prompt) must start with render(dummy head); the text after the dummy assistant's
close + junction is the suffix. When the whole render is a string extension of the dummy's
own render the template is append-only there (``strict``); otherwise the template re-renders
past turns (Qwen3 dropping ``<think>`` after a new user query) — which is exactly why the
recorded ids, not a re-render, make the prefix.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from ._errors import BridgeError, TemplateError, TruncatedTurnError
from ._family import DUMMY_ASSISTANT, Family, LengthRule, dummy_prefixes, probe_family
from ._history import tools_key
from ._tokenizer import ChatTokenizer, chat_messages

__all__ = ["PromptBuilder", "Rendered"]


@dataclass(slots=True)
class Rendered:
    """The ids a turn's prompt adds after ``prefix_len`` recorded ids (all of the prompt for
    a full render), with each new message's ``[start, end)`` span in absolute positions (the
    generation prompt after the last span belongs to no message)."""

    ids: list[int]
    prefix_len: int
    spans: list[tuple[int, int]]
    text: str
    full: bool
    strict: bool = True
    synthesized_close: bool = False
    reason: str = ""

    def prompt(self, prefix: Sequence[int]) -> list[int]:
        """The whole prompt: ``prefix`` (the recorded ids, ``prefix_len`` long) + these."""
        if len(prefix) != self.prefix_len:
            raise ValueError(f"prefix has {len(prefix)} ids, expected {self.prefix_len}")
        return [*prefix, *self.ids]


@dataclass(slots=True)
class _Dummy:
    messages: list[dict[str, Any]]
    head: str  # render of the dummy without its assistant turn
    whole: str  # render of the whole dummy (ends with close + junction)


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # binary search on equal prefixes: C-speed slices, log n steps
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass(slots=True)
class PromptBuilder:
    """Builds prompt ids for one tokenizer directory's template (see module docstring).

    ``length_rule`` decides how a turn that ended by length is extended; ``max_span_messages``
    bounds the per-message span renders of a full render (beyond it the rest of the
    messages share one span), since each costs one render of the history so far."""

    tok: ChatTokenizer
    length_rule: LengthRule = LengthRule.CLOSE
    max_span_messages: int = 256
    family: Family = field(init=False)
    _dummies: dict[bytes, _Dummy] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.family = probe_family(self.tok)

    def _dummy(self, tools: Sequence[Any] | None) -> _Dummy:
        key = tools_key(tools)
        d = self._dummies.get(key)
        if d is None:
            last: TemplateError | None = None
            for prefix in dummy_prefixes():
                try:
                    d = _Dummy(prefix, self.tok.render(prefix[:-1], tools),
                               self.tok.render(prefix, tools))
                    break
                except TemplateError as exc:
                    last = exc
            if d is None:
                raise last or TemplateError("no dummy prefix renders")
            if len(self._dummies) > 64:  # tools rarely vary; bound the cache anyway
                self._dummies.clear()
            self._dummies[key] = d
        return d

    def tools_render_differently(self, old: bytes, new: bytes) -> bool:
        """Whether the template renders a conversation differently under the tools keyed
        ``old`` and ``new`` (:func:`~tracewire.tito._history.tools_key`): a tools block
        before the history, or tool-dependent turns. False for a template that ignores
        tools, so changing them there keeps the branch."""
        if old == new:
            return False
        return self._dummy(orjson.loads(old)).whole != self._dummy(orjson.loads(new)).whole

    def _boundaries(self, base: list[dict[str, Any]], msgs: list[dict[str, Any]],
                    tools: Sequence[Any] | None, text: str, start: int) -> list[int]:
        """Character offset in ``text`` where each message of ``msgs`` ends (its render
        after ``base`` shares that much with ``text``)."""
        ends = []
        prev = start
        for k in range(1, len(msgs) + 1):
            if k > self.max_span_messages and k < len(msgs):
                ends.append(prev)
                continue
            r = self.tok.render(base + msgs[:k], tools)
            if text.startswith(r):
                prev = max(prev, len(r))
            else:
                # The message renders differently when it is last (Qwen3 gives the last
                # assistant turn a <think> block): end it at the first close + junction
                # after its content instead.
                at = _common_prefix(r, text)
                content = msgs[k - 1].get("content")
                if isinstance(content, str) and content.strip():
                    found = text.find(content.strip(), max(prev, 0))
                    at = max(at, found + len(content.strip())) if found >= 0 else at
                marker = self.family.close + self.family.junction
                close_at = text.find(marker, at) if marker else -1
                prev = max(prev, close_at + len(marker) if close_at >= 0 else at)
            ends.append(prev)
        return ends

    def _spans(self, char_ends: list[int], offsets: list[tuple[int, int]], start_tok: int,
               first_char: int) -> list[tuple[int, int]]:
        starts = [o[0] for o in offsets]
        spans = []
        begin = start_tok
        for c in char_ends:
            # A token that straddles a boundary belongs to the message it starts in.
            end = start_tok + bisect.bisect_left(starts, c - first_char)
            spans.append((begin, max(begin, end)))
            begin = max(begin, end)
        return spans

    def render_full(self, messages: Sequence[dict[str, Any]], tools: Sequence[Any] | None = None,
                    *, reason: str = "") -> Rendered:
        """The whole prompt for ``messages`` (a first turn, or a re-render because ``reason``)
        with a generation prompt, and a span per message."""
        msgs = chat_messages(messages)
        text = self.tok.render(msgs, tools, add_generation_prompt=True)
        ids, offsets = self.tok.encode_offsets(text)
        ends = self._boundaries([], msgs, tools, text, 0)
        return Rendered(ids=ids, prefix_len=0, spans=self._spans(ends, offsets, 0, 0),
                        text=text, full=True, reason=reason)

    def suffix_text(self, messages: Sequence[dict[str, Any]], tools: Sequence[Any] | None
                    ) -> tuple[str, bool, list[int]]:
        """(the text the new ``messages`` add after a turn's close + junction, whether the
        template rendered them as a strict string extension, each message's end offset in
        that text)."""
        msgs = chat_messages(messages)
        d = self._dummy(tools)
        whole = self.tok.render(d.messages + msgs, tools, add_generation_prompt=True)
        if not whole.startswith(d.head):
            raise BridgeError("the template renders the fixed prefix differently once new "
                              "messages follow it", reason="template_not_prefix_stable")
        marker = DUMMY_ASSISTANT + self.family.close + self.family.junction
        strict = whole.startswith(d.whole)
        if strict:
            cut = len(d.whole)
        else:
            at = whole.find(marker, len(d.head))
            if at < 0:
                raise BridgeError("the template does not close the dummy assistant turn the "
                                  "way it closes a last turn", reason="junction_unknown")
            cut = at + len(marker)
        ends = self._boundaries(d.messages, msgs, tools, whole, cut)
        return whole[cut:], strict, [max(0, e - cut) for e in ends]

    def bridge(self, last_id: int | None, prefix_len: int,
               messages: Sequence[dict[str, Any]], tools: Sequence[Any] | None = None
               ) -> Rendered:
        """The ids that follow ``prefix_len`` recorded ids (ending with ``last_id``, the last
        sampled id) for the new ``messages``: junction + suffix + generation prompt.
        :class:`BridgeError` when the template makes that impossible, and
        :class:`TruncatedTurnError` for a length-ended turn under ``LengthRule.REFUSE``."""
        if not messages:
            raise BridgeError("no new messages to append", reason="no_new_messages")
        fam = self.family
        synthesized = False
        lead = fam.junction
        if last_id is None or last_id not in fam.stop_ids:
            if self.length_rule is LengthRule.REFUSE:
                raise TruncatedTurnError(
                    "the previous turn ended by length (no close token); extending it is "
                    "refused by the configured rule")
            if fam.close:
                lead = fam.close + fam.junction
                synthesized = True
        suffix, strict, ends = self.suffix_text(messages, tools)
        text = lead + suffix
        ids, offsets = self.tok.encode_offsets(text)
        spans = self._spans([len(lead) + e for e in ends], offsets, prefix_len, 0)
        return Rendered(ids=ids, prefix_len=prefix_len, spans=spans, text=text, full=False,
                        strict=strict, synthesized_close=synthesized)
