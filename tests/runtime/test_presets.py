"""Agent presets: what they render to (always), and a real run against the built-in model
inside bwrap where the CLI is installed (skipped otherwise, naming the missing program; a
failure where ``TRACEWIRE_REQUIRE_AGENTS=1``). mini-swe-agent runs in bwrap through its
example (tests/examples/test_agents.py), from the project's venv."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable
from typing import Any

import pytest

from tracewire.model import MODEL_NAME
from tracewire.proxy import Proxy
from tracewire.runtime import (
    AgentPreset,
    BwrapRuntime,
    LocalRuntime,
    ProxyEndpoint,
    SandboxError,
    claude_code,
    codex,
    mini_swe_agent,
)

from .conftest import needs_bwrap

SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
EP = ProxyEndpoint("127.0.0.1", 4321, "sid1", "tw-secret")
PRESETS: dict[str, Callable[[str], AgentPreset]] = {
    "claude-code": lambda p: claude_code(p, model=MODEL_NAME, max_turns=3, tools=[],
                                         max_output_tokens=512),
    "codex": lambda p: codex(p, model=MODEL_NAME),
    "mini-swe-agent": lambda p: mini_swe_agent(p, model=MODEL_NAME),
}


def test_claude_code_renders_session_and_quiet_env() -> None:
    rt = BwrapRuntime(endpoint=EP)
    argv, env, files = claude_code("fix it", model="m", max_turns=5, tools=[]).render(rt)
    assert argv[:3] == ["claude", "-p", "fix it"] and argv[argv.index("--model") + 1] == "m"
    assert argv[argv.index("--tools") + 1] == ""
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:4321/sessions/sid1"
    assert env["DISABLE_AUTOUPDATER"] == env["DISABLE_TELEMETRY"] == "1"
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert env["CLAUDE_CONFIG_DIR"] == "/workspace/.tracewire/claude"
    assert files == {}


def test_codex_config_points_only_at_the_session() -> None:
    rt = LocalRuntime(endpoint=EP)
    rt.workdir = "/w"
    argv, env, files = codex("do it", model="m").render(rt)
    assert argv[:2] == ["codex", "exec"] and argv[-1] == "do it"
    cfg = tomllib.loads(files[".tracewire/codex/config.toml"])
    assert cfg["model_provider"] == "tracewire" and cfg["model"] == "m"
    prov = cfg["model_providers"]["tracewire"]
    assert prov["base_url"] == "http://127.0.0.1:4321/sessions/sid1/v1"
    assert prov["wire_api"] == "responses" and prov["env_key"] == "OPENAI_API_KEY"
    assert env["CODEX_HOME"] == "/w/.tracewire/codex"


def test_mini_swe_agent_uses_litellm_openai_provider() -> None:
    # A host place: rendering for bwrap also resolves `mini` (see test_sandbox_path.py).
    argv, env, _ = mini_swe_agent("t", model="m").render(LocalRuntime(endpoint=EP))
    assert argv[argv.index("-m") + 1] == "openai/m"
    assert env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"


def test_render_needs_an_endpoint() -> None:
    with pytest.raises(SandboxError):
        codex("x", model="m").render(BwrapRuntime())


async def _run(proxy: Proxy, preset: AgentPreset, venv: str | None = None
               ) -> tuple[Any, Any, BwrapRuntime]:
    """Run ``preset`` in bwrap; a CLI installed in a venv gets that venv bound and on PATH."""
    path = f"{venv}/bin:{SANDBOX_PATH}" if venv else None
    missing = preset.missing(path)
    if missing:
        if os.environ.get("TRACEWIRE_REQUIRE_AGENTS") == "1":  # CI installed the CLIs
            pytest.fail(f"{preset.name}: {', '.join(missing)} missing, and "
                        "TRACEWIRE_REQUIRE_AGENTS=1")
        pytest.skip(f"{preset.name}: {', '.join(missing)} not installed")
    session = proxy.create_session()
    rt = BwrapRuntime(endpoint=ProxyEndpoint.from_session(session),
                      ro_paths=[venv] if venv else [])
    async with rt:
        argv, env, files = preset.render(rt)
        if path:
            env["PATH"] = path
        await rt.put_files(files)
        res = await rt.exec(argv, env=env, timeout=300)
    return session, res, rt


@needs_bwrap
async def test_claude_code_in_bwrap_completes_against_the_builtin_model(proxy: Proxy) -> None:
    session, res, rt = await _run(proxy, PRESETS["claude-code"]("Say hello, then stop."))
    assert res.ok, res.to_info()
    assert rt.relay is None  # closed with the runtime
    calls = session.trace.calls
    assert calls and all(c.error is None for c in calls), [c.error for c in calls]
    br = session.trace.branch(calls[-1].node)
    assert int(br.mask.sum()) > 0  # sampled tokens recorded


@needs_bwrap
async def test_codex_in_bwrap_reaches_its_session_over_responses(proxy: Proxy) -> None:
    """Codex's own prompt (~22k tokens) exceeds the built-in model's 8,192-token context, so
    the turn is refused by the model; what this checks is the path: its streamed Responses
    request, from inside the sandbox, arrives at its session through the relay."""
    session, res, _ = await _run(proxy, PRESETS["codex"]("Say hello, then stop."))
    calls = session.trace.calls
    assert calls, res.to_info()
    assert all("maximum context length" in str(c.error) for c in calls), [c.error for c in calls]
    assert b"maximum context length" in res.stdout
