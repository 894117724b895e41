"""Environments and rollouts: how tasks, a harness and scoring become recorded episodes.

Define an :class:`Environment` (tasks with stable keys, a harness, reward functions and
metrics), then run it with :func:`evaluate` (or ``tracewire eval``); the env server calls
:func:`run_rollout` for one rollout at a time.
"""

from ._api import Environment, Harness, Scorer, Task, Timeouts
from ._chat import ChatHarness
from ._command import CommandFailed, CommandHarness
from ._context import Rollout, assistant_texts, final_text
from ._evaluate import evaluate
from ._load import load_environment
from ._rollout import PHASES, run_rollout
from ._schema import tool_schema
from ._tools import ToolsHarness

__all__ = [
    "PHASES",
    "ChatHarness",
    "CommandFailed",
    "CommandHarness",
    "Environment",
    "Harness",
    "Rollout",
    "Scorer",
    "Task",
    "Timeouts",
    "ToolsHarness",
    "assistant_texts",
    "evaluate",
    "final_text",
    "load_environment",
    "run_rollout",
    "tool_schema",
]
