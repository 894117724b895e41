"""The chat template: OpenAI-style messages and tools -> token ids, and generated ids -> message.

Layout (no newlines or other glue between turns; nothing follows an ``<|eot|>``)::

    <|system|>{system text}[\\n\\n]# Tools\\n{one JSON line per function}<|eot|>
    <|user|>{text}<|eot|>
    <|assistant|>{text}<|call|>{name}<|args|>{arguments}<|endcall|>...<|eot|>
    <|tool|>{result text}<|eot|>
    <|assistant|>                       (the generation prompt)

Message text is encoded as plain bytes: special-token spellings inside content never become
special tokens. Tool-call arguments are kept as the raw string the model produced, so a
generated turn renders back to exactly the ids that were sampled.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._errors import ModelError
from ._tokenizer import Tokenizer

__all__ = ["ChatTemplate", "ParsedTurn"]

_ROLES = {"system": "<|system|>", "developer": "<|system|>", "user": "<|user|>",
          "assistant": "<|assistant|>", "tool": "<|tool|>"}


@dataclass
class ParsedTurn:
    """A generated assistant turn split into text and tool calls ``(name, raw arguments)``."""

    content: str
    tool_calls: list[tuple[str, str]] = field(default_factory=list)
    complete: bool = True


def _text_of(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text":
                raise ModelError(f"{where}: only text content parts are supported")
            text = part.get("text")
            if not isinstance(text, str):
                raise ModelError(f"{where}: content part text must be a string")
            parts.append(text)
        return "".join(parts)
    raise ModelError(f"{where}: content must be a string, a list of parts or null")


def tools_text(tools: Sequence[Any]) -> str:
    """The ``# Tools`` block rendered into the system turn (one JSON object per line)."""
    lines: list[str] = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, Mapping) or tool.get("type", "function") != "function":
            raise ModelError(f"tools[{i}] must be {{'type': 'function', 'function': {{...}}}}")
        fn = tool.get("function")
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise ModelError(f"tools[{i}].function.name must be a string")
        lines.append(json.dumps(fn, ensure_ascii=False))
    return "# Tools\n" + "\n".join(lines)


class ChatTemplate:
    """Renders conversations to ids and parses generated ids back into a message."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tok = tokenizer
        sp = tokenizer.special
        self.header = {role: sp[name] for role, name in _ROLES.items()}
        self.eot, self.call = sp["<|eot|>"], sp["<|call|>"]
        self.args, self.endcall = sp["<|args|>"], sp["<|endcall|>"]

    def render(
        self,
        messages: Sequence[Any],
        tools: Sequence[Any] | None = None,
        add_generation_prompt: bool = True,
    ) -> list[int]:
        """Ids of the conversation, ending with ``<|assistant|>`` when asked."""
        if not isinstance(messages, Sequence) or isinstance(messages, str):
            raise ModelError("messages must be a list")
        ids: list[int] = []
        tools_block = tools_text(tools) if tools else ""
        pending_tools = bool(tools_block)
        if pending_tools and not any(
            isinstance(m, Mapping) and m.get("role") in ("system", "developer") for m in messages
        ):
            ids += [self.header["system"], *self.tok.encode(tools_block), self.eot]
            pending_tools = False
        for i, msg in enumerate(messages):
            where = f"messages[{i}]"
            if not isinstance(msg, Mapping):
                raise ModelError(f"{where} must be an object")
            role = msg.get("role")
            if role not in self.header:
                raise ModelError(f"{where}.role must be one of {sorted(self.header)}")
            text = _text_of(msg.get("content"), where)
            if role in ("system", "developer") and pending_tools:
                text = f"{text}\n\n{tools_block}" if text else tools_block
                pending_tools = False
            ids.append(self.header[role])
            ids += self.tok.encode(text)
            if role == "assistant":
                for name, arguments in self._calls_of(msg.get("tool_calls"), where):
                    ids.append(self.call)
                    ids += self.tok.encode(name)
                    ids.append(self.args)
                    ids += self.tok.encode(arguments)
                    ids.append(self.endcall)
            ids.append(self.eot)
        if add_generation_prompt:
            ids.append(self.header["assistant"])
        return ids

    def assistant_ids(self, content: str, tool_calls: Sequence[tuple[str, str]]) -> list[int]:
        """Ids of an assistant turn's body (after its header), ending with ``<|eot|>``."""
        ids = self.tok.encode(content)
        for name, arguments in tool_calls:
            ids += [self.call, *self.tok.encode(name), self.args, *self.tok.encode(arguments)]
            ids.append(self.endcall)
        ids.append(self.eot)
        return ids

    @staticmethod
    def _calls_of(raw: Any, where: str) -> list[tuple[str, str]]:
        if raw is None:
            return []
        if not isinstance(raw, list):
            raise ModelError(f"{where}.tool_calls must be a list")
        calls: list[tuple[str, str]] = []
        for j, call in enumerate(raw):
            fn = call.get("function") if isinstance(call, Mapping) else None
            if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
                raise ModelError(f"{where}.tool_calls[{j}].function.name must be a string")
            args = fn.get("arguments", "")
            if not isinstance(args, str):
                raise ModelError(f"{where}.tool_calls[{j}].function.arguments must be a string")
            calls.append((fn["name"], args))
        return calls

    def declared_tools(self, ids: Sequence[int]) -> tuple[str, ...] | None:
        """Names of the tools a rendered prompt declares (its first system turn's ``# Tools``
        block), or None when it declares none; what a trainer needs to rebuild the
        constraints a turn was sampled under from token ids alone."""
        try:
            start = list(ids).index(self.header["system"]) + 1
            end = list(ids).index(self.eot, start)
        except ValueError:
            return None
        text = b"".join(self.tok.token_bytes(int(t)) for t in ids[start:end]).decode(
            "utf-8", "replace")
        at = text.rfind("# Tools\n")
        if at < 0 or (at and not text[:at].endswith("\n\n")):
            return None
        names: list[str] = []
        for line in text[at + len("# Tools\n"):].split("\n"):
            try:
                fn = json.loads(line)
            except ValueError:
                return None
            if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
                return None
            names.append(fn["name"])
        return tuple(names) or None

    def parse(self, ids: Sequence[int]) -> ParsedTurn:
        """Split generated ids (after ``<|assistant|>``) into text and tool calls.

        Only the exact canonical syntax is parsed; an unfinished call is dropped (the turn
        was cut by ``max_tokens`` or a stop string and is marked incomplete).
        """
        dec = self.tok.token_bytes
        content = bytearray()
        calls: list[tuple[str, str]] = []
        name = args = bytearray()
        state = "content"
        complete = False
        for t in ids:
            if t == self.eot:
                complete = True
                break
            if t == self.call:
                state, name, args = "name", bytearray(), bytearray()
            elif t == self.args and state == "name":
                state = "args"
            elif t == self.endcall and state == "args":
                calls.append((name.decode("utf-8", "replace"), args.decode("utf-8", "replace")))
                state = "after"
            elif self.tok.is_special(t):
                state = "broken"
            elif state == "content":
                content += dec(t)
            elif state == "name":
                name += dec(t)
            elif state == "args":
                args += dec(t)
        return ParsedTurn(content.decode("utf-8", "replace"), calls, complete)
