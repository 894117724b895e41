"""The ``tools`` harness: a function-calling loop with Python functions as tools.

Schemas come from the functions' signatures and docstrings (see ``_schema``). A call with
bad JSON, an unknown tool or a raising tool is answered with an error text the model can
read, and counted in ``trace.metrics`` (``tool_calls``, ``tool_errors``), never raised.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Sequence
from typing import Any

from ..trace import StopReason
from ._api import Task, call_user
from ._chat import Messages, PromptFn, SystemArg, complete, initial_messages
from ._context import Rollout
from ._harness import Harness
from ._schema import tool_schema

__all__ = ["ToolsHarness", "UnknownTool"]

#: Longest tool result (characters) sent back to the model; longer results are cut.
MAX_RESULT_CHARS = 16_384


def _result_text(value: Any) -> str:
    if isinstance(value, str):
        text = value
    elif isinstance(value, float) and value.is_integer():
        text = str(int(value))
    else:
        try:
            text = json.dumps(value, ensure_ascii=False)
        except (TypeError, ValueError):
            text = str(value)
    return text if len(text) <= MAX_RESULT_CHARS else text[:MAX_RESULT_CHARS] + "…"


class UnknownTool(LookupError):
    """The model called a tool the harness does not have."""

    def __init__(self, name: str) -> None:
        super().__init__(f"unknown tool {name}")
        self.name = name


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, UnknownTool):
        return f"Error: {exc}"
    return f"Error: {type(exc).__name__}: {exc}"


class ToolsHarness(Harness):
    """Function calling: the model calls tools until it answers without a call.

    Stops ``done`` on an answer without tool calls, ``max_turns`` when the budget of model
    turns is spent. ``format_result`` turns a tool's return value into the tool message
    text; ``format_error`` does the same for a failure.
    """

    kind = "tools"

    def __init__(
        self,
        tools: Sequence[Callable[..., Any]],
        *,
        prompt: PromptFn | None = None,
        system: SystemArg = None,
        max_turns: int = 10,
        format_result: Callable[[Any], str] = _result_text,
        format_error: Callable[[BaseException], str] = _error_text,
        schemas: Sequence[dict[str, Any]] | None = None,
    ) -> None:
        if max_turns < 1:
            raise ValueError("max_turns must be at least 1")
        self.functions = {getattr(fn, "__name__", ""): fn for fn in tools}
        self.schemas = list(schemas) if schemas is not None else [tool_schema(f) for f in tools]
        self.prompt = prompt
        self.system = system
        self.max_turns = max_turns
        self.format_result = format_result
        self.format_error = format_error

    def messages(self, task: Task) -> Messages:
        """The opening messages for ``task``."""
        return initial_messages(task, self.prompt, self.system)

    async def call_tool(self, name: str, arguments: str) -> tuple[str, bool]:
        """Run one tool call; returns (result text, ok)."""
        fn = self.functions.get(name)
        if fn is None:
            return self.format_error(UnknownTool(name)), False
        try:
            args = json.loads(arguments) if arguments.strip() else {}
            if not isinstance(args, dict):
                raise TypeError("arguments must be a JSON object")
            inspect.signature(fn).bind(**args)
        except (ValueError, TypeError) as exc:
            return self.format_error(exc), False
        try:
            value = await call_user(lambda: fn(**args))
        except Exception as exc:
            return self.format_error(exc), False
        return self.format_result(value), True

    async def run(self, rollout: Rollout) -> None:
        """Loop: model turn, then every requested tool call, until an answer or the budget."""
        messages = self.messages(rollout.task)
        rollout.state["messages"] = messages
        metrics = rollout.trace.metrics
        metrics.setdefault("tool_calls", 0.0)
        metrics.setdefault("tool_errors", 0.0)
        for _turn in range(self.max_turns):
            reply, finish = await complete(rollout, messages, self.schemas)
            messages.append(reply)
            calls = reply.get("tool_calls") or []
            if not calls:
                rollout.stop(StopReason.LENGTH if finish == "length" else StopReason.DONE)
                return
            for call in calls:
                fn = call["function"]
                text, ok = await self.call_tool(fn["name"], fn["arguments"] or "")
                metrics["tool_calls"] += 1
                if not ok:
                    metrics["tool_errors"] += 1
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": text})
        rollout.stop(StopReason.MAX_TURNS)
