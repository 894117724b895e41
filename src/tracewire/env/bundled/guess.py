"""``guess``: multi-turn guess-the-number; the environment answers each guess with feedback."""

from __future__ import annotations

from ...trace import Trace
from .. import ChatHarness, Environment, Messages, Rollout, Task, assistant_texts
from ._common import data_tasks

__all__ = ["feedback", "load_environment"]


def feedback(secret: int, guess_text: str) -> str:
    """The environment's reply to one guess (the exact texts the model was trained on)."""
    try:
        guess = int(guess_text.strip())
    except ValueError:
        return "Please reply with a number."
    if guess < secret:
        return "Higher."
    if guess > secret:
        return "Lower."
    return "Correct!"


def respond(task: Task, messages: Messages, rollout: Rollout) -> str | None:
    """Feedback on the latest guess; stops when solved or out of guesses."""
    guesses = sum(1 for m in messages if m["role"] == "assistant")
    reply = feedback(int(task["secret"]), str(messages[-1].get("content") or ""))
    if reply == "Correct!":
        rollout.stop("solved")
        return None
    if guesses >= int(task["max_turns"]):
        rollout.stop("out_of_guesses")
        return None
    return reply


def solved(task: Task, trace: Trace) -> float:
    """1.0 when one of the guesses hit the secret number."""
    secret = int(task["secret"])
    return 1.0 if any(feedback(secret, t) == "Correct!" for t in assistant_texts(trace)) else 0.0


def guesses(task: Task, trace: Trace) -> float:
    """Number of guesses made."""
    return float(len(assistant_texts(trace)))


def load_environment() -> Environment:
    """The guess-the-number environment (90 games over 1-20, 1-50 and 1-100)."""
    return Environment(
        "guess",
        tasks=data_tasks("guess"),
        harness=ChatHarness(prompt=lambda t: str(t["first_message"]), respond=respond),
        rewards=[solved],
        metrics=[guesses],
        sampling={"max_tokens": 8},
        description="Multi-turn guess-the-number with Higher./Lower. feedback.",
    )
