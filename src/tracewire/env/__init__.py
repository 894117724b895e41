"""Environments and rollouts: how tasks, a harness and scoring become recorded episodes.

Define an :class:`Environment` (tasks with stable keys, a harness, reward functions and
metrics) and run it with ``tracewire.evaluate`` (or ``tracewire eval``); one rollout is
:func:`run_rollout`, given anything shaped like a proxy (:class:`ProxyLike`). This part
depends only on ``trace``.
"""

from ._api import Environment, Scorer, Task, Timeouts
from ._chat import ChatHarness, Messages
from ._command import CommandFailed, CommandHarness
from ._context import Rollout, assistant_texts, close_http_client, final_text, http_client
from ._harness import Harness
from ._load import BUNDLED, load_environment
from ._rollout import PHASES, run_rollout
from ._runtime import (
    EndpointLike,
    ExecResultLike,
    PhaseHook,
    PlaceLike,
    PresetLike,
    RuntimeFactory,
    RuntimeLike,
    runtime_of,
)
from ._schema import tool_schema
from ._session import ProxyLike, SessionLike, SessionsLike
from ._tools import ToolsHarness, UnknownTool

__all__ = [
    "BUNDLED",
    "PHASES",
    "ChatHarness",
    "CommandFailed",
    "CommandHarness",
    "EndpointLike",
    "Environment",
    "ExecResultLike",
    "Harness",
    "Messages",
    "PhaseHook",
    "PlaceLike",
    "PresetLike",
    "ProxyLike",
    "Rollout",
    "RuntimeFactory",
    "RuntimeLike",
    "Scorer",
    "SessionLike",
    "SessionsLike",
    "Task",
    "Timeouts",
    "ToolsHarness",
    "UnknownTool",
    "assistant_texts",
    "close_http_client",
    "final_text",
    "http_client",
    "load_environment",
    "run_rollout",
    "runtime_of",
    "tool_schema",
]
