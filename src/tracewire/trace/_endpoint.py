"""The harness-facing endpoints a recorded ``Call`` went through (``Call.endpoint``).

``Call.endpoint`` stays a string so records written by any build read back; these members
compare equal to their values, so the stored bytes are the same either way.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["Endpoint"]


class Endpoint(StrEnum):
    """Which API shape the agent spoke for one model call."""

    #: OpenAI chat completions (``POST /v1/chat/completions``).
    CHAT = "chat"
    #: Anthropic messages (``POST /v1/messages``).
    MESSAGES = "messages"
    #: OpenAI responses (``POST /v1/responses``).
    RESPONSES = "responses"
