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
from ._options import RUNTIMES, RuntimeName

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
    sandbox_paths: Sequence[str] = (),
    image: str | None = None,
    engine: str = "docker",
) -> RuntimeFactory:
    """A factory making a ``name`` runtime for each rollout's session. ``bwrap`` binds the
    running venv and ``ro_paths`` read-only, and ``sandbox_paths`` read-only and first on
    its PATH (where an agent CLI is installed); ``docker`` needs ``image`` (default:
    ``TRACEWIRE_DOCKER_IMAGE``). ``limits`` default to the runtime's own."""
    if name not in RUNTIMES:
        raise EnvError(f"unknown runtime {name!r} (known: {', '.join(RUNTIMES)})")
    if name == RuntimeName.LOCAL and (ro_paths or sandbox_paths):
        raise EnvError("--ro-path/--sandbox-path apply to a sandbox (bwrap, docker); the "
                       "local runtime sees the host's files and PATH as they are")
    if name == RuntimeName.DOCKER and sandbox_paths:
        raise EnvError("--sandbox-path applies to bwrap; the docker image has its own PATH")
    if name == RuntimeName.DOCKER:
        image = image or os.environ.get("TRACEWIRE_DOCKER_IMAGE")
        if not image:
            raise EnvError("the docker runtime needs an image: set TRACEWIRE_DOCKER_IMAGE "
                           "(built from a local root filesystem; see docs/RUNTIMES.md)")

    return _Factory(name, limits, [*ro_paths], image, engine, [*sandbox_paths])


class _Factory:
    """Makes one named runtime per rollout (``name`` is recorded in the run's meta)."""

    def __init__(self, name: str, limits: Limits | None, ro_paths: list[str],
                 image: str | None, engine: str, sandbox_paths: list[str] | None = None
                 ) -> None:
        self.name = name
        self.limits = limits
        self.ro_paths = ro_paths
        self.image = image
        self.engine = engine
        self.sandbox_paths = sandbox_paths or []

    def __repr__(self) -> str:
        return f"runtime_factory({self.name!r})"

    def __call__(self, session: SessionLike, on_phase: PhaseHook) -> Runtime:
        ep = ProxyEndpoint.from_session(session)
        if self.name == RuntimeName.LOCAL:
            return LocalRuntime(endpoint=ep, limits=self.limits, on_phase=on_phase)
        if self.name == RuntimeName.BWRAP:
            return BwrapRuntime(endpoint=ep, ro_paths=[*_venv(), *self.ro_paths],
                                sandbox_path=self.sandbox_paths, limits=self.limits,
                                on_phase=on_phase)
        assert self.image is not None
        return DockerRuntime(self.image, engine=self.engine, endpoint=ep,
                             ro_paths=self.ro_paths, limits=self.limits, on_phase=on_phase)


def with_runtime(env: Environment, runtime: str | RuntimeFactory | None = None, *,
                 ro_paths: Sequence[str] = (), sandbox_paths: Sequence[str] = ()
                 ) -> Environment:
    """``env`` with its command harness's runtime resolved: ``runtime`` when given (it
    overrides the environment's choice), else the harness's own (a name becomes a
    factory); ``ro_paths``/``sandbox_paths`` are added to a named runtime's (``tracewire
    eval --ro-path/--sandbox-path``). Returns ``env`` itself when there is nothing to
    change."""
    harness = env.harness
    paths = bool(ro_paths or sandbox_paths)
    if not isinstance(harness, CommandHarness):
        if runtime is not None or paths:
            raise EnvError(f"{env.name}: a runtime applies to command harnesses; this "
                           f"environment's harness is {harness.kind!r}")
        return env
    chosen = runtime if runtime is not None else harness.runtime
    if paths:
        chosen = _with_paths(chosen, [*ro_paths], [*sandbox_paths])
    elif chosen is None or (chosen is harness.runtime and not isinstance(chosen, str)):
        return env
    assert chosen is not None
    factory = runtime_factory(chosen) if isinstance(chosen, str) else chosen
    # A copy: the loaded environment (often a module-level object) stays as written.
    other = copy.copy(env)
    other.harness = harness.with_runtime(factory)
    return other


def _with_paths(chosen: str | RuntimeFactory | None, ro_paths: list[str],
                sandbox_paths: list[str]) -> RuntimeFactory:
    """A named runtime (or one made by :func:`runtime_factory`) with more paths bound."""
    if chosen is None:
        raise EnvError("--ro-path/--sandbox-path need a sandbox: pass --runtime bwrap")
    if isinstance(chosen, str):
        return runtime_factory(chosen, ro_paths=ro_paths, sandbox_paths=sandbox_paths)
    if not isinstance(chosen, _Factory):
        raise EnvError("--ro-path/--sandbox-path apply to a named runtime, not to a custom "
                       "runtime factory (give it the paths itself)")
    return runtime_factory(chosen.name, limits=chosen.limits,
                           ro_paths=[*chosen.ro_paths, *ro_paths],
                           sandbox_paths=[*chosen.sandbox_paths, *sandbox_paths],
                           image=chosen.image, engine=chosen.engine)
