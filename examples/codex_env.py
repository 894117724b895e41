"""Example environment: the Codex CLI (``codex exec``) fixes a one-line bug, in a sandbox.

Each task puts a small Python module and its test into the agent's workdir; Codex runs
non-interactively with a custom Responses provider whose base URL is its proxy session
(the only endpoint it can reach inside ``bwrap``); the reward runs the task's test inside
the same sandbox.

    tracewire eval examples/codex_env.py -n 2 --max-model-len 65536
    python examples/codex_env.py -n 1 --max-model-len 65536   # and print what it recorded

Installing the Codex CLI is up to you (``npm install -g @openai/codex``). The built-in
model is a tiny n-gram model: it will not fix the bug (reward 0), but every turn is
recorded token for token. Codex's own prompt is ~22k tokens, beyond the built-in model's
default 8,192-token context: pass ``--max-model-len``. Its hosted ``web_search`` tool and
its ``multi_agent_v1`` namespace cannot be forwarded to a chat-completions model; the
trace records them (``trace.info["tools_not_forwarded"]``).
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from tracewire.env import CommandHarness, Environment, Task, runtime_of
from tracewire.runtime import codex
from tracewire.trace import Trace

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
    """The instruction Codex gets on its command line."""
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


def load_environment(runtime: str = "bwrap") -> Environment:
    """The example environment; ``runtime`` is its own choice (``--runtime`` overrides)."""
    harness = CommandHarness.from_preset(lambda task: codex(prompt(task)),
                                         files=lambda task: task["files"], runtime=runtime)
    return Environment("codex", tasks=TASKS, harness=harness, rewards=[tests_pass],
                       metrics=[turns, mismatches],
                       description="The Codex CLI fixes a one-line bug (sandboxed).")


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
