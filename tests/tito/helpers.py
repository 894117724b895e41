"""A scripted 'model' for token-in/token-out tests: completions in each family's grammar."""

from __future__ import annotations

from typing import Any

from tracewire.tito import ChatTokenizer, PromptBuilder

TOOLS = [{"type": "function", "function": {
    "name": "lookup", "description": "Look a key up.",
    "parameters": {"type": "object", "properties": {"i": {"type": "integer"}}}}}]


def completion_text(family: str, turn: int, *, think: bool = True, compact: bool = True,
                    call: bool = True, trailing: str = "") -> str:
    """What the model 'writes' at ``turn`` (without the stop token)."""
    args = f'{{"i":{turn}}}' if compact else f'{{"i": {turn}}}'
    if family == "llama3":
        if call:
            return f'{{"name": "lookup", "parameters": {args}}}'
        return f"done {turn}{trailing}"
    head = f"<think>\nthinking {turn}\n</think>\n\n" if family == "qwen3" and think else ""
    body = f"step {turn}{trailing}"
    if call:
        body += f'\n<tool_call>\n{{"name": "lookup", "arguments": {args}}}\n</tool_call>'
    return head + body


def sample_ids(b: PromptBuilder, text: str, *, canonical: bool = True,
               stop: bool = True) -> list[int]:
    """Ids for ``text``: the canonical encoding, or a deliberately non-canonical one (every
    character its own token where the vocabulary merges them), then the close token."""
    tok: ChatTokenizer = b.tok
    ids = tok.encode(text) if canonical else [i for ch in text for i in tok.encode(ch)]
    return ids + ([b.family.stop_ids[0]] if stop else [])


def tool_results(turn: int, calls: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """``n`` tool messages answering the first call of ``calls``."""
    cid = calls[0]["id"] if calls else "none"
    return [{"role": "tool", "tool_call_id": cid, "content": f"result {turn}.{j}"}
            for j in range(n)]
