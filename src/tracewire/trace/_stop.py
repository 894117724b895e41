"""The stop conditions tracewire itself writes into ``Trace.stop``.

Harnesses and environments may record their own reasons (``solved``, ``out_of_guesses``):
``Trace.stop`` stays a string, and these members compare equal to their values, so stored
records read the same either way.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["StopReason"]


class StopReason(StrEnum):
    """How a trace's agent ended, as written by the harnesses, the rollout and the proxy."""

    #: The agent finished on its own (an answer without tool calls, a clean exit).
    DONE = "done"
    #: The harness's (or the proxy session's) budget of model turns was spent.
    MAX_TURNS = "max_turns"
    #: The proxy session's token budget was spent.
    MAX_TOKENS = "max_tokens"
    #: A model turn was cut by its token limit.
    LENGTH = "length"
    BOOT_ERROR = "boot_error"
    BOOT_TIMEOUT = "boot_timeout"
    SETUP_ERROR = "setup_error"
    SETUP_TIMEOUT = "setup_timeout"
    AGENT_ERROR = "agent_error"
    AGENT_TIMEOUT = "agent_timeout"
    FINALIZE_ERROR = "finalize_error"
    FINALIZE_TIMEOUT = "finalize_timeout"
    SCORING_ERROR = "scoring_error"
    SCORING_TIMEOUT = "scoring_timeout"
    #: The env server failed the rollout (its worker died, a timeout, or it was busy).
    SERVE_ERROR = "serve_error"

    @classmethod
    def failed(cls, phase: str, timed_out: bool) -> StopReason:
        """The stop of a rollout phase that raised (``<phase>_error``) or ran past its
        deadline (``<phase>_timeout``)."""
        return cls(f"{phase}_{'timeout' if timed_out else 'error'}")
