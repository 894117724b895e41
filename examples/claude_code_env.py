"""Example environment: Claude Code (``claude -p``) fixes a one-line bug, in a sandbox.

Each task puts a small Python module and its test into the agent's workdir; Claude Code
runs headless with ``--max-turns 2`` against its proxy session (the only endpoint it can
reach inside ``bwrap``); the reward runs the task's test inside the same sandbox. Three
variants, by the tools Claude Code offers the model:

    tracewire eval examples/claude_code_env.py -n 1 --max-model-len 131072   # its defaults
    tracewire eval examples/claude_code_env.py:restricted -n 1 --max-model-len 32768
    tracewire eval examples/claude_code_env.py:no_tools -n 2                  # fits 8,192
    python examples/claude_code_env.py --tools Read,Edit,Bash --max-model-len 32768

Installing Claude Code is up to you (``npm install -g @anthropic-ai/claude-code``). The
built-in model is a tiny n-gram model: it will not fix the bug (reward 0), but every turn
is recorded token for token. Claude Code's system prompt is ~62k tokens with its default
tools, ~9k with Read/Edit/Bash and ~5k with none; the built-in model's context is 8,192
tokens unless ``--max-model-len`` raises it.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from tracewire.env import CommandHarness, Environment, Task, runtime_of
from tracewire.runtime import claude_code
from tracewire.trace import Trace

#: The restricted set of Claude Code's built-in tools (``restricted()``).
TOOLS = ["Read", "Edit", "Bash"]

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
    """The instruction Claude Code gets on its command line."""
    test = next(n for n in task["files"] if n.startswith("test_"))
    return (f"There is a bug in {task['module']}. Fix it so that `python3 {test}` "
            "prints ok. Change only that file.")


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


def load_environment(runtime: str = "bwrap", tools: list[str] | None = None) -> Environment:
    """The example environment; ``tools`` are the built-in tools Claude Code offers (None:
    its own defaults, ``[]``: none); ``runtime`` is its own choice (``--runtime``
    overrides)."""
    harness = CommandHarness.from_preset(
        lambda task: claude_code(prompt(task), max_turns=2, tools=tools,
                                 max_output_tokens=512),
        files=lambda task: task["files"], runtime=runtime)
    return Environment("claude_code", tasks=TASKS, harness=harness, rewards=[tests_pass],
                       metrics=[turns, mismatches],
                       description="Claude Code fixes a one-line bug (sandboxed).")


def restricted() -> Environment:
    """Claude Code offering only Read, Edit and Bash (a ~9k-token system prompt)."""
    return load_environment(tools=TOOLS)


def no_tools() -> Environment:
    """Claude Code offering no tools (a ~5k-token prompt: fits the default context)."""
    return load_environment(tools=[])


async def main() -> None:
    """Run the example and print what each rollout recorded."""
    from tracewire.compose import evaluate

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runtime", default="bwrap", choices=("local", "bwrap", "docker"))
    ap.add_argument("--max-model-len", type=int, default=None)
    ap.add_argument("--tools", default=None,
                    help="comma-separated built-in tools ('' for none; default: its own)")
    ap.add_argument("-n", type=int, default=None)
    args = ap.parse_args()
    tools = None if args.tools is None else [t for t in args.tools.split(",") if t]
    env = load_environment(args.runtime, tools)
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
