"""The agent-CLI examples (``examples/claude_code_env.py``, ``examples/codex_env.py``) run
end to end against the built-in model, inside ``bwrap`` (no network but the relay), through
``evaluate``: every model call answered, 0 token mismatches, the sandbox cleaned up.
Skipped, naming the program, where a CLI is not installed; Codex also needs a built-in
model whose context can be raised past its ~22k-token prompt."""

from __future__ import annotations

import importlib.util
import inspect
import shutil
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tracewire.compose import evaluate
from tracewire.model import ModelServer

from .conftest import BWRAP_REASON

EXAMPLES = Path(__file__).parents[2] / "examples"
#: Whether this build's built-in model takes a context length (then tools fit).
HAS_LEN = "max_model_len" in inspect.signature(ModelServer).parameters
BIG = 65536


def example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_tw_example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def runtimes() -> list[Any]:
    # Only inside bwrap (a network namespace holding just lo): the vendors' CLIs try to reach
    # their own hosts at start-up, and tests talk to loopback only. Under `local` they work
    # the same (docs/RUNTIMES.md has the figures), but would try the host's network.
    return [pytest.param("bwrap", marks=pytest.mark.skipif(
        BWRAP_REASON is not None, reason=str(BWRAP_REASON)))]


def check(result: Any) -> list[dict[str, Any]]:
    """Every rollout: the agent exited 0, all its calls were answered, token-exact."""
    seen = []
    for ep in result.run:
        (trace,) = ep.traces
        info = {"stop": trace.stop, "turns": len(trace.calls), "tokens": len(trace.tokens.ids),
                "mismatches": trace.info.get("token_mismatches", 0),
                "errors": [(e.type, e.message[:300]) for e in trace.errors]}
        seen.append(info)
        assert trace.stop == "done" and not trace.errors, info
        assert trace.calls and all(c.error is None for c in trace.calls), info
        assert info["mismatches"] == 0, info
        assert "runtime_close" in trace.timing
        assert trace.info["command"]["preset"] in ("claude-code", "codex")
    assert seen
    return seen


@pytest.mark.parametrize("runtime", runtimes())
async def test_claude_code_example(runtime: str, tmp_path: Path) -> None:
    if shutil.which("claude") is None:
        pytest.skip("Claude Code (claude) is not installed")
    mod = example("claude_code_env")
    # Without a configurable context only the tool-less prompt (~5k tokens) fits in 8,192.
    env = mod.load_environment(runtime, None if HAS_LEN else [])
    result = await evaluate(env, n=1, out=tmp_path / "run", concurrency=1,
                            max_model_len=BIG if HAS_LEN else None)
    check(result)


@pytest.mark.parametrize("runtime", runtimes())
async def test_codex_example(runtime: str, tmp_path: Path) -> None:
    if shutil.which("codex") is None:
        pytest.skip("the Codex CLI (codex) is not installed")
    if not HAS_LEN:
        pytest.skip("Codex's ~22k-token prompt needs ModelServer(max_model_len=), which this "
                    "build's built-in model lacks (context fixed at 8,192 tokens)")
    env = example("codex_env").load_environment(runtime)
    result = await evaluate(env, n=1, out=tmp_path / "run", concurrency=1, max_model_len=BIG)
    check(result)
