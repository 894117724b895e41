"""The ``chat`` harness: a multi-turn conversation whose user turns come from the environment.

Each model turn goes through the rollout's proxy session with the official ``openai`` async
SDK, so the proxy records it token for token. The messages sent back are exactly the ones
the model produced (content and raw tool-call arguments), which keeps the proxy's prefix
matching exact.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias

from .._errors import EnvError
from ..trace import StopReason
from ._api import Task, call_user
from ._context import Rollout
from ._harness import Harness

__all__ = ["ChatHarness", "Messages", "assistant_message", "complete", "initial_messages"]

#: OpenAI-style chat messages as plain dicts.
Messages: TypeAlias = list[dict[str, Any]]
#: ``prompt(task)``: the first user turn (text) or the opening messages.
PromptFn: TypeAlias = Callable[[Task], "str | Messages"]
#: System text, or ``system(task)``; None takes the task's ``system`` field.
SystemArg: TypeAlias = "str | Callable[[Task], str | None] | None"
#: ``respond(task, messages, rollout)``: the next user turn, or None to stop.
RespondFn: TypeAlias = Callable[[Task, Messages, Rollout], "str | Awaitable[str | None] | None"]


def initial_messages(task: Task, prompt: PromptFn | None, system: SystemArg) -> Messages:
    """Opening messages: the system text (``system``, ``system(task)``, else the task's
    ``system`` field, if any), then ``prompt(task)`` (default: ``task["messages"]`` or
    ``task["prompt"]``)."""
    first: str | Messages
    if callable(system):
        system = system(task)
    elif system is None and isinstance(task.data.get("system"), str):
        system = task["system"]
    if prompt is not None:
        first = prompt(task)
    elif "messages" in task.data:
        first = [dict(m) for m in task["messages"]]
    elif "prompt" in task.data:
        first = str(task["prompt"])
    else:
        raise EnvError(f"task {task.key!r} has neither 'prompt' nor 'messages' and no prompt=")
    msgs: Messages = [{"role": "system", "content": system}] if system is not None else []
    if isinstance(first, str):
        msgs.append({"role": "user", "content": first})
    else:
        msgs.extend(first)
    return msgs


def assistant_message(message: Any) -> dict[str, Any]:
    """The SDK's response message as a plain dict holding what the model produced."""
    out: dict[str, Any] = {"role": "assistant", "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": tc.id,
                "type": "function",
                "function": {"name": tc.function.name, "arguments": tc.function.arguments},
            }
            for tc in message.tool_calls
        ]
    return out


async def complete(
    rollout: Rollout, messages: Messages, tools: list[dict[str, Any]] | None = None
) -> tuple[dict[str, Any], str | None]:
    """One model turn through the session: returns (assistant message, finish_reason)."""
    kwargs: dict[str, Any] = {"model": rollout.model, "messages": messages, **rollout.sampling}
    if tools:
        kwargs["tools"] = tools
    # The SDK's low-level post: same client, retries and errors, but it skips the SDK's
    # recursive TypedDict transform of `messages`, which costs ~0.5 ms per message of
    # history on the event loop (18 ms at 30 messages) — our messages are wire-ready dicts.
    from openai.types.chat import ChatCompletion

    resp = await rollout.client().post("/chat/completions", body=kwargs, cast_to=ChatCompletion)
    if not resp.choices:
        raise EnvError("the model answered with no choices")
    choice = resp.choices[0]
    return assistant_message(choice.message), choice.finish_reason


class ChatHarness(Harness):
    """Multi-turn chat: the model answers, ``respond`` supplies the next user turn or stops.

    Without ``respond`` the conversation is single-turn (one answer, stop ``done``). Stops
    with ``max_turns`` when the budget of model turns is spent, ``length`` when a turn was
    cut by the token limit and ``stop_on_length`` is set.
    """

    kind = "chat"

    def __init__(
        self,
        *,
        prompt: PromptFn | None = None,
        system: SystemArg = None,
        respond: RespondFn | None = None,
        max_turns: int = 20,
        stop_on_length: bool = False,
    ) -> None:
        if max_turns < 1:
            raise ValueError("max_turns must be at least 1")
        self.prompt = prompt
        self.system = system
        self.respond = respond
        self.max_turns = max_turns
        self.stop_on_length = stop_on_length

    async def run(self, rollout: Rollout) -> None:
        """Alternate model turns and environment turns until one side stops."""
        messages = initial_messages(rollout.task, self.prompt, self.system)
        rollout.state["messages"] = messages
        for _turn in range(self.max_turns):
            reply, finish = await complete(rollout, messages)
            messages.append(reply)
            if finish == "length" and self.stop_on_length:
                rollout.stop(StopReason.LENGTH)
                return
            if self.respond is None:
                rollout.stop(StopReason.DONE)
                return
            nxt = await call_user(self.respond, rollout.task, messages, rollout)
            if nxt is None or rollout.stop_reason is not None:
                rollout.stop(StopReason.DONE)
                return
            messages.append({"role": "user", "content": str(nxt)})
        rollout.stop(StopReason.MAX_TURNS)
