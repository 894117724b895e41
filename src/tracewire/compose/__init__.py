"""The composition root: where env, proxy, model and store are wired together.

:func:`evaluate_plan` runs an :class:`EvalPlan` (an environment's tasks through an
interception proxy into a stored run) and sums it up; ``tracewire eval`` / ``tracewire
demo`` build the plan from the command line, :func:`evaluate` from keyword options.
:func:`env_factory` is the env server's runner for real environments; ``*_COMMAND`` are
the sub-commands it wires (the proxy with token-in/token-out, the env server with real
environments). The parts it
wires know nothing of each other. Names load on first use (``tracewire --help`` imports
this package's command modules).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._backend import Rollouts, rollouts
    from ._cli_demo import DEMO_COMMAND
    from ._cli_eval import EVAL_COMMAND
    from ._cli_proxy import PROXY_COMMAND, TOKEN_IN_UPSTREAM
    from ._cli_serve import ENV_MODEL_OPTIONS, SERVE_COMMAND
    from ._envrunner import env_factory
    from ._evaluate import EvalResult, default_run_dir, evaluate, evaluate_plan
    from ._options import BACKENDS, RUNTIMES, Backend, RolloutPlan
    from ._plan import (
        EvalOptions,
        EvalPlan,
        ModelOptions,
        OutputOptions,
        PlacementOptions,
        SamplingOptions,
        SandboxOptions,
        ScaleOptions,
    )
    from ._runtime import runtime_factory, with_runtime
    from ._summary import Summary, Tally, pass_at_k
    from ._tito import make_upstream

# name -> module defining it (PEP 562).
_LAZY: dict[str, str] = {
    "BACKENDS": "._options",
    "DEMO_COMMAND": "._cli_demo",
    "ENV_MODEL_OPTIONS": "._cli_serve",
    "EVAL_COMMAND": "._cli_eval",
    "PROXY_COMMAND": "._cli_proxy",
    "SERVE_COMMAND": "._cli_serve",
    "TOKEN_IN_UPSTREAM": "._cli_proxy",
    "RUNTIMES": "._options",
    "Backend": "._options",
    "EvalOptions": "._plan",
    "EvalPlan": "._plan",
    "EvalResult": "._evaluate",
    "ModelOptions": "._plan",
    "OutputOptions": "._plan",
    "PlacementOptions": "._plan",
    "SamplingOptions": "._plan",
    "SandboxOptions": "._plan",
    "ScaleOptions": "._plan",
    "RolloutPlan": "._options",
    "Rollouts": "._backend",
    "Summary": "._summary",
    "Tally": "._summary",
    "default_run_dir": "._evaluate",
    "env_factory": "._envrunner",
    "evaluate": "._evaluate",
    "evaluate_plan": "._evaluate",
    "make_upstream": "._tito",
    "pass_at_k": "._summary",
    "rollouts": "._backend",
    "runtime_factory": "._runtime",
    "with_runtime": "._runtime",
}

__all__ = [
    "BACKENDS",
    "DEMO_COMMAND",
    "ENV_MODEL_OPTIONS",
    "EVAL_COMMAND",
    "PROXY_COMMAND",
    "RUNTIMES",
    "SERVE_COMMAND",
    "TOKEN_IN_UPSTREAM",
    "Backend",
    "EvalOptions",
    "EvalPlan",
    "EvalResult",
    "ModelOptions",
    "OutputOptions",
    "PlacementOptions",
    "RolloutPlan",
    "Rollouts",
    "SamplingOptions",
    "SandboxOptions",
    "ScaleOptions",
    "Summary",
    "Tally",
    "default_run_dir",
    "env_factory",
    "evaluate",
    "evaluate_plan",
    "make_upstream",
    "pass_at_k",
    "rollouts",
    "runtime_factory",
    "with_runtime",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tracewire.compose' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value
