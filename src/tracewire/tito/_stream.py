"""The completion grammar as a state machine fed text deltas: relays content and reasoning as
they stream, holds tool-call markup back until it parses.

Held back at any moment is only what could still turn out to be markup: a tail that is a
prefix of ``<tool_call>``, ``</think>`` or a stop token's text, the inside of an open
``<tool_call>``, a Llama 3 answer that opens with ``{``, and trailing whitespace (content is
trimmed, as a whole-text parse trims it). Everything relayed is final: the message the
harness assembles from the deltas is :attr:`StreamParser.result`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from ..tokens import Family, ToolFormat
from ._parse import (
    CALL_CLOSE,
    CALL_OPEN,
    PYTHON_TAG,
    THINK_CLOSE,
    THINK_OPEN,
    ParsedCall,
    ParsedCompletion,
    parse_llama_calls,
    parse_tool_json,
    strip_stop,
)

__all__ = ["EventKind", "StreamEvent", "StreamParser", "parse_completion"]


class EventKind(StrEnum):
    """What a relayable piece of a streamed completion is."""

    CONTENT = "content"
    REASONING = "reasoning"
    TOOL_CALL = "tool_call"


@dataclass(slots=True)
class StreamEvent:
    """One relayable piece: ``kind`` is ``content``, ``reasoning`` or ``tool_call``."""

    kind: EventKind
    text: str = ""
    call: ParsedCall | None = None


def _held_tail(buf: str, markers: tuple[str, ...]) -> int:
    """Length of the longest tail of ``buf`` that is a prefix of a marker (or one whole)."""
    best = 0
    for m in markers:
        for n in range(min(len(m), len(buf)), best, -1):
            if buf.endswith(m[:n]):
                best = n
                break
    return best


class _Trimmed:
    """Relays text trimmed at both ends without knowing where it ends: leading whitespace is
    dropped, trailing whitespace waits for more text."""

    __slots__ = ("pending", "started", "text")

    def __init__(self) -> None:
        self.started = False
        self.pending = ""
        self.text = ""

    def add(self, s: str) -> str:
        if not self.started:
            s = s.lstrip()
            if not s:
                return ""
            self.started = True
        s = self.pending + s
        body = s.rstrip()
        self.pending = s[len(body):]
        self.text += body
        return body


class StreamParser:
    """Feed completion text as it arrives (:meth:`feed`), then :meth:`close`; each returns
    the events to relay, and :attr:`result` is the parsed message once closed."""

    def __init__(self, family: Family, *, think_opened: bool = False) -> None:
        self.family = family
        self.result = ParsedCompletion()
        self._buf = ""
        self._mode = "think" if think_opened else ("start" if family.think else "text")
        self._content = _Trimmed()
        self._reasoning = _Trimmed()
        self._saw_reasoning = think_opened
        self._stops = tuple(s for s in family.stop_texts if s)
        self._closed = False

    def _text(self, s: str, out: list[StreamEvent]) -> None:
        t = self._content.add(s)
        if t:
            out.append(StreamEvent(EventKind.CONTENT, t))

    def _think(self, s: str, out: list[StreamEvent]) -> None:
        t = self._reasoning.add(s)
        if t:
            out.append(StreamEvent(EventKind.REASONING, t))

    def feed(self, delta: str) -> list[StreamEvent]:
        """Take the next piece of completion text; returns what can be relayed now."""
        out: list[StreamEvent] = []
        self._buf += delta
        self._step(out, final=False)
        return out

    def close(self) -> list[StreamEvent]:
        """End of the completion: flush what was held, finish :attr:`result`."""
        out: list[StreamEvent] = []
        if self._closed:
            return out
        self._closed = True
        self._buf = strip_stop(self._buf, self._stops)
        self._step(out, final=True)
        r = self.result
        if self._saw_reasoning:
            r.reasoning = self._reasoning.text
        content = self._content.text
        r.content = content if content or not r.tool_calls else None
        return out

    def _step(self, out: list[StreamEvent], final: bool) -> None:
        fmt = self.family.tool_format
        while True:
            buf = self._buf
            if self._mode == "start":
                lead = buf.lstrip()
                if lead.startswith(THINK_OPEN):
                    self._buf = lead[len(THINK_OPEN):]
                    self._mode = "think"
                    self._saw_reasoning = True
                    continue
                if not final and THINK_OPEN.startswith(lead):
                    return
                self._mode = "text"
                continue
            if self._mode == "think":
                end = buf.find(THINK_CLOSE)
                if end >= 0:
                    self._think(buf[:end], out)
                    self._buf = buf[end + len(THINK_CLOSE):]
                    self._mode = "text"
                    continue
                keep = 0 if final else _held_tail(buf, (THINK_CLOSE, *self._stops))
                self._think(buf[: len(buf) - keep], out)
                self._buf = buf[len(buf) - keep:]
                return
            if self._mode == "text" and fmt is ToolFormat.LLAMA3_JSON and \
                    not self._content.started:
                lead = buf.lstrip()
                if lead.startswith(("{", PYTHON_TAG)):
                    self._mode = "llama"
                    continue
                if not final and (not lead or PYTHON_TAG.startswith(lead)):
                    return
            if self._mode == "llama":
                if not final:
                    return
                calls = parse_llama_calls(buf)
                self._buf = ""
                if calls is not None:
                    self.result.tool_calls.extend(calls)
                    out.extend(StreamEvent(EventKind.TOOL_CALL, call=c) for c in calls)
                else:
                    if '"name"' in buf:
                        self.result.malformed.append(buf)
                    self._text(buf, out)
                return
            if self._mode == "call":
                end = buf.find(CALL_CLOSE)
                if end < 0:
                    if final:
                        self.result.malformed.append(CALL_OPEN + buf)
                        self._text(CALL_OPEN + buf, out)
                        self._buf = ""
                    return
                raw = buf[:end]
                self._buf = buf[end + len(CALL_CLOSE):]
                self._mode = "text"
                call = parse_tool_json(raw)
                if call is None:
                    self.result.malformed.append(CALL_OPEN + raw + CALL_CLOSE)
                    self._text(CALL_OPEN + raw + CALL_CLOSE, out)
                else:
                    self.result.tool_calls.append(call)
                    out.append(StreamEvent(EventKind.TOOL_CALL, call=call))
                continue
            # plain text
            if fmt is ToolFormat.HERMES:
                start = buf.find(CALL_OPEN)
                if start >= 0:
                    self._text(buf[:start], out)
                    self._buf = buf[start + len(CALL_OPEN):]
                    self._mode = "call"
                    continue
                markers: tuple[str, ...] = (CALL_OPEN, *self._stops)
            else:
                markers = self._stops
            keep = 0 if final else _held_tail(buf, markers)
            self._text(buf[: len(buf) - keep], out)
            self._buf = buf[len(buf) - keep:]
            return


def parse_completion(text: str, family: Family, *, think_opened: bool = False
                     ) -> ParsedCompletion:
    """The assistant message in ``text`` (decoded with special tokens kept);
    ``think_opened`` when the generation prompt ended inside a ``<think>`` block. The same
    state machine as :class:`~tracewire.tito.StreamParser`, fed at once, so a streamed and a
    whole answer always agree."""
    p = StreamParser(family, think_opened=think_opened)
    p.feed(text)
    p.close()
    return p.result
