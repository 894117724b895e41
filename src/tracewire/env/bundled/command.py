"""``command``: one-word questions answered by a separate agent program (a subprocess)."""

from __future__ import annotations

from pathlib import Path

from ...trace import Trace
from .. import CommandHarness, Environment, Rollout, Task
from ._common import data_tasks

__all__ = ["AGENT", "load_environment"]

#: The agent program the environment runs (a standalone script using the openai SDK).
AGENT = Path(__file__).with_name("command_agent.py")


def _reply(trace: Trace) -> str:
    command = trace.info.get("command") or {}
    return str(command.get("stdout", ""))


def correct(task: Task, trace: Trace) -> float:
    """1.0 when the program printed the expected word (case and a final period ignored)."""
    return 1.0 if _reply(trace).strip().rstrip(".").lower() == task["answer"].lower() else 0.0


async def _keep_reply(task: Task, rollout: Rollout) -> None:
    # Keep the reply on the trace for people reading the run.
    rollout.trace.info["reply"] = _reply(rollout.trace).strip()


def load_environment() -> Environment:
    """The command environment (99 capital / opposite / plural questions)."""
    return Environment(
        "command",
        tasks=data_tasks("command"),
        # The script is copied into the workdir, so it runs in any runtime (bwrap sees no
        # project directory).
        harness=CommandHarness(["{python}", "{workdir}/command_agent.py"], input="both",
                               files=lambda _task: {AGENT.name: AGENT.read_text("utf-8")}),
        rewards=[correct],
        finalize=_keep_reply,
        sampling={"max_tokens": 16},
        description="A subprocess agent (openai SDK) answering one-word questions.",
    )
