"""What a template family does at a turn boundary, learned from the template itself.

The junction rule is the text a template puts between one assistant turn's close token and
the next message: ChatML/Qwen writes ``<|im_end|>\\n`` (the model stops at ``<|im_end|>``, so
the ``\\n`` must be added), Llama 3 writes ``<|eot_id|>`` and nothing after it. Rather than
trusting a name, the rule is read off a render of a fixed dummy conversation: whatever
follows the dummy assistant's content is close token + junction. The family name only picks
the tool-call format the parser expects and the extra stop tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from ._errors import TemplateError
from ._tokenizer import ChatTokenizer

__all__ = ["DUMMY_ASSISTANT", "Family", "FamilyName", "LengthRule", "ToolFormat",
           "dummy_prefixes", "probe_family"]

#: Content of the dummy turns: words no real conversation holds, so they can be found again.
DUMMY_SYSTEM = "twDummySystemZq"
DUMMY_USER = "twDummyUserZq"
DUMMY_ASSISTANT = "twDummyAssistantZq"


class FamilyName(StrEnum):
    """The template families with a known junction rule; ``generic`` is the fallback."""

    CHATML = "chatml"
    LLAMA3 = "llama3"
    GENERIC = "generic"


class ToolFormat(StrEnum):
    """How a family's completions spell tool calls."""

    HERMES = "hermes"  # <tool_call>{"name": ..., "arguments": ...}</tool_call>
    LLAMA3_JSON = "llama3_json"  # a bare {"name": ..., "parameters": ...} object
    NONE = "none"


class LengthRule(StrEnum):
    """What to do when the turn being extended ended by length (no close token sampled):
    ``close`` synthesizes the template's close token (a prompt token, mask 0) before the
    junction; ``refuse`` raises :class:`~tracewire.tito.TruncatedTurnError` (409)."""

    CLOSE = "close"
    REFUSE = "refuse"


@dataclass(frozen=True, slots=True)
class Family:
    """A template family's turn-boundary facts: the close token text, the junction text
    after it, the ids that end a completion, and the completion grammar."""

    name: FamilyName
    close: str
    junction: str
    stop_ids: tuple[int, ...]
    stop_texts: tuple[str, ...]
    tool_format: ToolFormat
    think: bool


def dummy_prefixes() -> list[list[dict[str, Any]]]:
    """Candidate fixed prefixes, tried in order (some templates refuse a system role)."""
    sys_ = {"role": "system", "content": DUMMY_SYSTEM}
    user = {"role": "user", "content": DUMMY_USER}
    asst = {"role": "assistant", "content": DUMMY_ASSISTANT}
    return [[sys_, user, asst], [user, asst]]


_EXTRA_STOPS = {FamilyName.CHATML: ("<|endoftext|>",),
                FamilyName.LLAMA3: ("<|eom_id|>", "<|end_of_text|>")}


def probe_family(tok: ChatTokenizer, tools: list[Any] | None = None) -> Family:
    """The :class:`Family` of ``tok``'s template, read off a render of a dummy
    conversation; :class:`TemplateError` when no dummy renders."""
    text = None
    for prefix in dummy_prefixes():
        try:
            text = tok.render(prefix, tools)
            break
        except TemplateError:
            continue
    if text is None or DUMMY_ASSISTANT not in text:
        raise TemplateError("the chat template renders no dummy conversation")
    tail = text[text.rindex(DUMMY_ASSISTANT) + len(DUMMY_ASSISTANT):]
    close = ""
    for special in sorted(tok.special, key=len, reverse=True):
        if tail.startswith(special):
            close = special
            break
    if close == "<|im_end|>":
        name = FamilyName.CHATML
    elif close == "<|eot_id|>":
        name = FamilyName.LLAMA3
    else:
        name = FamilyName.GENERIC
    stop_texts = [close] if close else []
    stop_texts += [t for t in _EXTRA_STOPS.get(name, ()) if t in tok.special]
    eos = tok.hf.eos_token
    if isinstance(eos, str) and eos and eos not in stop_texts:
        stop_texts.append(eos)
    stop_ids = tuple(tok.special[t] if t in tok.special else int(tok.token_id(t) or 0)
                     for t in stop_texts)
    template = str(tok.hf.chat_template)
    if "<tool_call>" in template:
        fmt = ToolFormat.HERMES
    elif name is FamilyName.LLAMA3:
        fmt = ToolFormat.LLAMA3_JSON
    else:
        fmt = ToolFormat.NONE
    return Family(name=name, close=close, junction=tail[len(close):],
                  stop_ids=stop_ids, stop_texts=tuple(stop_texts), tool_format=fmt,
                  think="<think>" in template)
