"""Example environment: mini-swe-agent (``mini``) fixes a one-line bug, in a sandbox.

Each task puts a small Python module and its test into the agent's workdir; mini-swe-agent
runs in yolo mode through litellm's ``openai/`` provider, whose base URL is its proxy
session (the only endpoint it can reach inside ``bwrap``), for at most ``STEP_LIMIT``
model calls; the reward runs the task's test inside the same sandbox.

    tracewire eval examples/mini_swe_agent_env.py -n 2
    python examples/mini_swe_agent_env.py -n 1          # and print what each rollout did

Install it into the environment tracewire runs from (``.venv/bin/pip install
mini-swe-agent``): ``bwrap`` binds that environment read-only, so ``mini`` runs from it.
The built-in model is a tiny n-gram model: it will not fix the bug (reward 0), but every
turn is recorded token for token.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from tracewire.env import CommandHarness, Environment, Task, runtime_of
from tracewire.runtime import AgentPreset, mini_swe_agent
from tracewire.trace import Trace

#: Model calls before mini-swe-agent stops (its own default is unlimited).
STEP_LIMIT = 2

TASKS: list[dict[str, Any]] = [
    {"key": "add", "module": "calc.py",
     "files": {"calc.py": "def add(a, b):\n    return a - b\n",
               "test_calc.py": "from calc import add\nassert add(2, 3) == 5\nprint('ok')\n"}},
    {"key": "upper", "module": "text.py",
     "files": {"text.py": "def shout(s):\n    return s.lower() + '!'\n",
               "test_text.py": "from text import shout\nassert shout('hi') == 'HI!'\n"
                               "print('ok')\n"}},
]


def prompt(task: Task) -> str:
    """The instruction mini-swe-agent gets on its command line."""
    test = next(n for n in task["files"] if n.startswith("test_"))
    return (f"There is a bug in {task['module']}. Fix it so that `python3 {test}` "
            "prints ok. Change only that file.")


def mini_executable() -> str:
    """``mini`` beside the running interpreter (the environment bound into the sandbox),
    else the one on PATH, else the bare name (the boot error then names it)."""
    here = Path(sys.prefix) / "bin" / "mini"
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    return shutil.which("mini") or "mini"


def preset(task: Task) -> AgentPreset:
    """The mini-swe-agent preset, with a step limit and the path of its executable."""
    p = mini_swe_agent(prompt(task))
    exe = mini_executable()
    return dataclasses.replace(
        p, argv=(exe, *p.argv[1:], "-c", "mini.yaml", "-c", f"agent.step_limit={STEP_LIMIT}"),
        executables=(exe,))


async def tests_pass(task: Task, trace: Trace) -> float:
    """1.0 when the task's test passes, run inside the rollout's sandbox."""
    rt = runtime_of(trace)
    if rt is None:
        return 0.0
    test = next(n for n in task["files"] if n.startswith("test_"))
    res = await rt.exec(["python3", test], timeout=30)
    return 1.0 if res.exit_code == 0 else 0.0


def turns(task: Task, trace: Trace) -> float:
    """Model calls the agent made."""
    return float(len(trace.calls))


def mismatches(task: Task, trace: Trace) -> float:
    """Prompts whose tokens did not extend the recorded ones (0 means token-exact)."""
    return float(trace.info.get("token_mismatches", 0))


def load_environment(runtime: str = "bwrap") -> Environment:
    """The example environment; ``runtime`` is its own choice (``--runtime`` overrides)."""
    harness = CommandHarness.from_preset(preset, files=lambda task: task["files"],
                                         runtime=runtime)
    return Environment("mini_swe_agent", tasks=TASKS, harness=harness, rewards=[tests_pass],
                       metrics=[turns, mismatches],
                       description="mini-swe-agent fixes a one-line bug (sandboxed).")


async def main() -> None:
    """Run the example and print what each rollout recorded."""
    from tracewire.compose import evaluate

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runtime", default="bwrap", choices=("local", "bwrap", "docker"))
    ap.add_argument("--max-model-len", type=int, default=None)
    ap.add_argument("-n", type=int, default=None)
    args = ap.parse_args()
    env = load_environment(args.runtime)
    result = await evaluate(env, n=args.n, max_model_len=args.max_model_len, concurrency=1)
    for ep in result.run:
        for tr in ep.traces:
            print(ep.task_key, {"stop": tr.stop, "turns": len(tr.calls),
                                "tokens": len(tr.columns.ids),
                                "mismatches": tr.info.get("token_mismatches", 0),
                                "reward": tr.reward,
                                "errors": [f"{e.type}: {e.message[:200]}" for e in tr.errors],
                                "call_errors": [str(c.error)[:200] for c in tr.calls
                                                if c.error is not None]})


if __name__ == "__main__":
    asyncio.run(main())
