"""The agent-CLI examples (Claude Code with its default tools, a restricted set and none;
Codex; mini-swe-agent) finish a bundled task under ``bwrap`` against the built-in model,
through ``evaluate``: the agent exited 0, every model call was answered and recorded with
the upstream's usage, 0 token mismatches, the sandbox closed. Only inside ``bwrap`` (a
network namespace holding just ``lo``): the vendors' CLIs try their own hosts at start-up.

Where a CLI (or a usable bwrap) is missing the test skips, naming it; with
``TRACEWIRE_REQUIRE_AGENTS=1`` (set by ``.ci/run``, which installs the CLIs) it fails
instead, so CI cannot pass without running them."""

from __future__ import annotations

import asyncio
import importlib.util
import os
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tracewire.compose import evaluate
from tracewire.env import Environment
from tracewire.runtime import bwrap_usable

from . import doccmds

EXAMPLES = doccmds.ROOT / "examples"
BWRAP_REASON = asyncio.run(bwrap_usable())


def example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_tw_example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def require(exe: str) -> None:
    """Skip (or, in CI, fail) unless ``exe`` and a usable bwrap are there."""
    gone = doccmds.missing([exe])
    if BWRAP_REASON is not None:
        gone.append(f"a usable bwrap ({BWRAP_REASON})")
    if not gone:
        return
    if os.environ.get("TRACEWIRE_REQUIRE_AGENTS") == "1":
        pytest.fail(f"{', '.join(gone)} missing, and TRACEWIRE_REQUIRE_AGENTS=1")
    pytest.skip(f"{', '.join(gone)} not installed")


def check(result: Any, preset: str) -> list[dict[str, Any]]:
    """Every rollout: the agent exited 0, all its calls answered with usage, token-exact."""
    seen = []
    for ep in result.run:
        (trace,) = ep.traces
        info = {"task": ep.task_key, "stop": trace.stop, "turns": len(trace.calls),
                "tokens": len(trace.columns.ids),
                "mismatches": trace.info.get("token_mismatches", 0),
                "errors": [(e.type, e.message[:300]) for e in trace.errors],
                "stdout": str(trace.info.get("command", {}).get("stdout", ""))[-600:]}
        seen.append(info)
        assert trace.stop == "done" and not trace.errors, info
        assert trace.calls and all(c.error is None for c in trace.calls), info
        assert info["mismatches"] == 0, info
        # Streamed or not, each call holds the usage the model reported.
        assert all(c.usage.get("prompt_tokens", 0) > 0 for c in trace.calls), info
        assert "runtime_close" in trace.timing
        assert trace.info["command"]["preset"] == preset
        assert trace.info["command"]["runtime"] == "bwrap"
        # Probes of the session URL (Claude Code HEADs it) learn no variable's name.
        printed = str(trace.info["command"].get("stdout", "")) + str(
            trace.info["command"].get("stderr", ""))
        assert "TRACEWIRE_SESSION_TOKEN" not in printed, info
    assert seen
    return seen


async def run(env: Environment, tmp_path: Path, n: int, max_model_len: int | None = None
              ) -> Any:
    return await evaluate(env, n=n, out=tmp_path / "run", concurrency=1,
                          max_model_len=max_model_len)


async def test_claude_code_default_tools(tmp_path: Path) -> None:
    require("claude")
    env = example("claude_code_env").load_environment("bwrap", None)
    seen = check(await run(env, tmp_path, 1, 131072), "claude-code")
    # Its default tools make a system prompt far past the 8,192 the model starts with.
    assert seen[0]["tokens"] > 32768, seen


async def test_claude_code_restricted_tools(tmp_path: Path) -> None:
    require("claude")
    mod = example("claude_code_env")
    check(await run(mod.restricted(), tmp_path, 1, 32768), "claude-code")


async def test_claude_code_no_tools(tmp_path: Path) -> None:
    require("claude")
    mod = example("claude_code_env")
    seen = check(await run(mod.no_tools(), tmp_path, 2), "claude-code")
    assert all(s["tokens"] < 8192 for s in seen), seen


async def test_codex(tmp_path: Path) -> None:
    require("codex")
    result = await run(example("codex_env").load_environment("bwrap"), tmp_path, 1, 65536)
    check(result, "codex")
    # Codex's hosted web_search and its multi_agent_v1 namespace cannot be forwarded: the
    # trace says so on every call.
    for ep in result.run:
        (trace,) = ep.traces
        assert {"web_search", "multi_agent_v1"} <= set(trace.info["tools_not_forwarded"])
        assert all("tools_not_forwarded:web_search" in c.flags for c in trace.calls)


async def test_mini_swe_agent(tmp_path: Path) -> None:
    require("mini")
    mod = example("mini_swe_agent_env")
    seen = check(await run(mod.load_environment("bwrap"), tmp_path, 1), "mini-swe-agent")
    assert all(s["turns"] <= mod.STEP_LIMIT for s in seen), seen
