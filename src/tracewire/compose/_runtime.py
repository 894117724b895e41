"""Where a command harness's agent runs: the names ``local``/``bwrap``/``docker`` mapped to
``tracewire.runtime`` factories, chosen per environment (``CommandHarness(runtime=...)``)
or for a whole eval (``evaluate(runtime=...)``, ``tracewire eval --runtime``)."""

from __future__ import annotations

import copy
import os
import sys
from collections.abc import Sequence

from .._errors import EnvError
from ..env import CommandHarness, Environment, PhaseHook, RuntimeFactory, SessionLike
from ..runtime import (
    BwrapRuntime,
    DockerRuntime,
    Limits,
    LocalRuntime,
    ProxyEndpoint,
    Runtime,
)
from ._options import RUNTIMES

__all__ = ["RUNTIMES", "runtime_factory", "with_runtime"]


def _venv() -> list[str]:
    # A Python agent started as ``{python}`` inside bwrap needs this interpreter's venv
    # (its packages), read-only; the base interpreter is always bound.
    return [sys.prefix] if sys.prefix != sys.base_prefix else []


def runtime_factory(
    name: str,
    *,
    limits: Limits | None = None,
    ro_paths: Sequence[str] = (),
    image: str | None = None,
    engine: str = "docker",
) -> RuntimeFactory:
    """A factory making a ``name`` runtime for each rollout's session. ``bwrap`` binds the
    running venv and ``ro_paths`` read-only; ``docker`` needs ``image`` (default:
    ``TRACEWIRE_DOCKER_IMAGE``). ``limits`` default to the runtime's own."""
    if name not in RUNTIMES:
        raise EnvError(f"unknown runtime {name!r} (known: {', '.join(RUNTIMES)})")
    if name == "docker":
        image = image or os.environ.get("TRACEWIRE_DOCKER_IMAGE")
        if not image:
            raise EnvError("the docker runtime needs an image: set TRACEWIRE_DOCKER_IMAGE "
                           "(built from a local root filesystem; see docs/RUNTIMES.md)")

    return _Factory(name, limits, [*ro_paths], image, engine)


class _Factory:
    """Makes one named runtime per rollout (``name`` is recorded in the run's meta)."""

    def __init__(self, name: str, limits: Limits | None, ro_paths: list[str],
                 image: str | None, engine: str) -> None:
        self.name = name
        self.limits = limits
        self.ro_paths = ro_paths
        self.image = image
        self.engine = engine

    def __repr__(self) -> str:
        return f"runtime_factory({self.name!r})"

    def __call__(self, session: SessionLike, on_phase: PhaseHook) -> Runtime:
        ep = ProxyEndpoint.from_session(session)
        if self.name == "local":
            return LocalRuntime(endpoint=ep, limits=self.limits, on_phase=on_phase)
        if self.name == "bwrap":
            return BwrapRuntime(endpoint=ep, ro_paths=[*_venv(), *self.ro_paths],
                                limits=self.limits, on_phase=on_phase)
        assert self.image is not None
        return DockerRuntime(self.image, engine=self.engine, endpoint=ep,
                             ro_paths=self.ro_paths, limits=self.limits, on_phase=on_phase)


def with_runtime(env: Environment, runtime: str | RuntimeFactory | None = None) -> Environment:
    """``env`` with its command harness's runtime resolved: ``runtime`` when given (it
    overrides the environment's choice), else the harness's own (a name becomes a
    factory). Returns ``env`` itself when there is nothing to change."""
    harness = env.harness
    if not isinstance(harness, CommandHarness):
        if runtime is not None:
            raise EnvError(f"{env.name}: a runtime applies to command harnesses; this "
                           f"environment's harness is {harness.kind!r}")
        return env
    chosen = runtime if runtime is not None else harness.runtime
    if chosen is None or (chosen is harness.runtime and not isinstance(chosen, str)):
        return env
    factory = runtime_factory(chosen) if isinstance(chosen, str) else chosen
    # A copy: the loaded environment (often a module-level object) stays as written.
    other = copy.copy(env)
    other.harness = harness.with_runtime(factory)
    return other
