"""Agent presets: the argv, environment and config files that make a known agent CLI talk
only to its proxy session, with telemetry and auto-update off. Data, usable with any
runtime; a ``CommandHarness`` takes ``preset.render(runtime)`` as its argv/env/files.

In templates, ``{workdir}`` becomes the runtime's workdir as the agent sees it,
``{base_url}``/``{anthropic_base_url}`` the session URLs, ``{model}`` the model name.
``model`` may be left empty: a ``CommandHarness.from_preset`` fills in the rollout's.
The flags follow each CLI's documentation (checked December 2026); a CLI's end-to-end test
skips where it is not installed.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ._api import SandboxError

__all__ = ["AgentPreset", "claude_code", "codex", "mini_swe_agent"]

#: Variables every preset sets: no update checks, no telemetry, no colour codes.
_QUIET = {"NO_COLOR": "1", "DO_NOT_TRACK": "1", "TERM": "dumb"}


class _Urls(Protocol):
    @property
    def base_url(self) -> str: ...
    @property
    def anthropic_base_url(self) -> str: ...


class Placed(Protocol):
    """Where a preset runs: a :class:`~tracewire.runtime.Runtime`, or anything with its
    agent-side ``workdir`` and ``agent_endpoint``."""

    @property
    def workdir(self) -> str:
        """The workdir as the agent sees it."""
        ...

    @property
    def agent_endpoint(self) -> _Urls | None:
        """The session's URLs as the agent reaches them."""
        ...


@dataclass(frozen=True)
class AgentPreset:
    """One agent CLI's configuration for one task (see the module doc for templates)."""

    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    files: Mapping[str, str] = field(default_factory=dict)
    executables: tuple[str, ...] = ()
    model: str = ""

    def missing(self, path: str | None = None) -> list[str]:
        """The executables this preset needs that are not on ``path`` (default: the host
        PATH; a sandbox's ``search_path`` adds its ``sandbox_path`` dirs)."""
        return [e for e in self.executables if shutil.which(e, path=path) is None]

    def render(self, runtime: Placed, model: str | None = None
               ) -> tuple[list[str], dict[str, str], dict[str, str]]:
        """(argv, env, files) with the templates filled in for ``runtime``; ``{model}`` is
        the preset's model, else ``model`` (the rollout's, passed by the harness). A
        sandbox that can (``provide``) is asked to make the executables runnable inside:
        bound read-only with their install tree and interpreter, on its PATH."""
        ep = runtime.agent_endpoint
        if ep is None:
            raise SandboxError(f"preset {self.name}: the runtime has no proxy endpoint")
        provide = getattr(runtime, "provide", None)
        if provide is not None and self.executables:
            provide(self.executables)
        values = {"workdir": runtime.workdir, "base_url": ep.base_url,
                  "anthropic_base_url": ep.anthropic_base_url,
                  "model": self.model or model or ""}

        def fill(s: str) -> str:
            for k, v in values.items():
                s = s.replace("{" + k + "}", v)
            return s

        return ([fill(a) for a in self.argv], {k: fill(v) for k, v in self.env.items()},
                {k: fill(v) for k, v in self.files.items()})


def claude_code(prompt: str, *, model: str = "", max_turns: int = 30,
                tools: Sequence[str] | None = None,
                max_output_tokens: int | None = None) -> AgentPreset:
    """Claude Code headless (``claude -p``) on the Anthropic endpoint of the session.

    ``tools``: the built-in tools to offer (None: its defaults; ``[]``: none, which cuts
    its system prompt from ~62k to ~8k tokens). Permissions are skipped, since the runtime
    is the sandbox (``IS_SANDBOX=1`` lets it do so as root). ``max_output_tokens`` caps
    the ``max_tokens`` it asks for (its default, 32k, exceeds small models' context).
    """
    argv = ["claude", "-p", prompt, "--max-turns", str(max_turns), "--model", "{model}",
            "--output-format", "json", "--dangerously-skip-permissions"]
    if tools is not None:
        argv += ["--tools", ",".join(tools)]
    env = {**_QUIET, "ANTHROPIC_BASE_URL": "{anthropic_base_url}", "ANTHROPIC_MODEL": "{model}",
           "ANTHROPIC_SMALL_FAST_MODEL": "{model}", "DISABLE_TELEMETRY": "1",
           "DISABLE_AUTOUPDATER": "1", "DISABLE_ERROR_REPORTING": "1",
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "IS_SANDBOX": "1",
           "CLAUDE_CONFIG_DIR": "{workdir}/.tracewire/claude"}
    if max_output_tokens is not None:
        env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = str(max_output_tokens)
    return AgentPreset("claude-code", tuple(argv), env, executables=("claude",), model=model)


def codex(prompt: str, *, model: str = "") -> AgentPreset:
    """The Codex CLI (``codex exec --json``) with a custom Responses provider whose base URL
    is the session; its own sandbox is off (the runtime is the sandbox) and ``CODEX_HOME``
    points into the workdir, where its config is written."""
    config = "\n".join([
        'model = "{model}"',
        'model_provider = "tracewire"',
        "check_for_update_on_startup = false",
        'approval_policy = "never"',
        'sandbox_mode = "danger-full-access"',
        "",
        "[model_providers.tracewire]",
        'name = "tracewire"',
        'base_url = "{base_url}"',
        'env_key = "OPENAI_API_KEY"',
        'wire_api = "responses"',
        "",
        "[otel]",
        'exporter = "none"',
        "",
    ])
    argv = ("codex", "exec", "--json", "--skip-git-repo-check", "--model", "{model}", prompt)
    env = {**_QUIET, "CODEX_HOME": "{workdir}/.tracewire/codex"}
    return AgentPreset("codex", argv, env, {".tracewire/codex/config.toml": config},
                       executables=("codex",), model=model)


def mini_swe_agent(prompt: str, *, model: str = "") -> AgentPreset:
    """mini-swe-agent (``mini``) in yolo mode through litellm's ``openai/`` provider, whose
    base URL and key come from ``OPENAI_BASE_URL``/``OPENAI_API_KEY`` (the session's)."""
    argv = ("mini", "-y", "--exit-immediately", "-m", "openai/{model}", "-t", prompt)
    env = {**_QUIET, "MSWEA_CONFIGURED": "true", "MSWEA_COST_TRACKING": "ignore_errors",
           "MSWEA_GLOBAL_CONFIG_DIR": "{workdir}/.tracewire/mini",
           # litellm fetches its model price list at import unless told to use its copy.
           "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_TELEMETRY": "False"}
    return AgentPreset("mini-swe-agent", argv, env, executables=("mini",), model=model)

