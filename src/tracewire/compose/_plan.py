"""The plan of an eval: everything :func:`evaluate_plan` needs, as one frozen value.

An :class:`EvalPlan` names the environment and holds six groups of options: the model
and how the proxy reaches it, sampling, scale, the sandbox, where the rollouts run and
where the run is stored. Each group checks its options when it is made, so a plan that
exists is a plan that can start; a bad option is a :class:`~tracewire.PlanError` (a
``ValueError``) or, for a wrong type or an unknown name, a
:class:`~tracewire.PlanTypeError` (also a ``TypeError``), naming the option.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from .._errors import PlanError, PlanTypeError
from ..env import Environment, RuntimeFactory, Timeouts
from ._options import BACKENDS, DEFAULT_UPSTREAM_API, ENGINES, RUNTIMES, UPSTREAM_APIS, Backend

__all__ = ["EvalOptions", "EvalPlan", "ModelOptions", "OutputOptions", "PlacementOptions",
           "SamplingOptions", "SandboxOptions", "ScaleOptions"]


def _set(obj: object, name: str, value: object) -> None:
    # Normalising a frozen dataclass's own field in __post_init__.
    object.__setattr__(obj, name, value)


def _int(name: str, value: object, low: int | None, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    # bool is an int to Python, never a count or a seed to an eval.
    if not isinstance(value, int) or isinstance(value, bool):
        kind = "an int or None" if optional else "an int"
        raise PlanTypeError(f"{name} must be {kind}, not {type(value).__name__}")
    if low is not None and value < low:
        raise PlanError(f"{name} must be >= {low}, not {value}")


def _number(name: str, value: object, *, optional: bool = False) -> float | None:
    if value is None and optional:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        kind = "a number or None" if optional else "a number"
        raise PlanTypeError(f"{name} must be {kind}, not {type(value).__name__}")
    return float(value)


def _text(name: str, value: object) -> None:
    if value is not None and not isinstance(value, str):
        raise PlanTypeError(f"{name} must be a str or None, not {type(value).__name__}")


def _choice(name: str, value: object, known: tuple[str, ...], *, optional: bool = False
            ) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str) or value not in known:
        raise PlanError(f"unknown {name} {value!r} (known: {', '.join(known)})")


def _paths(name: str, value: object) -> tuple[str, ...]:
    # A lone string would be taken apart into one-letter paths.
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise PlanTypeError(f"{name} must be a list of paths, not {type(value).__name__}")
    for item in value:
        if not isinstance(item, (str, os.PathLike)):
            raise PlanTypeError(f"{name} holds a {type(item).__name__}, not a path")
    return tuple(str(os.fspath(item)) for item in value)


@dataclass(frozen=True)
class ModelOptions:
    """The model that answers and how the proxy reaches it: ``base_url`` (None: the
    built-in model, with ``max_model_len`` tokens of context when given) with ``api_key``;
    ``tokenizer`` serves it token-in/token-out over ``upstream_api``; ``engine`` starts a
    local engine on the GGUF file ``model`` names instead (it excludes both)."""

    model: str | None = None
    base_url: str | None = None
    api_key: str | None = None
    max_model_len: int | None = None
    tokenizer: str | None = None
    upstream_api: str = DEFAULT_UPSTREAM_API
    engine: str | None = None

    def __post_init__(self) -> None:
        for name in ("model", "base_url", "api_key", "tokenizer"):
            _text(name, getattr(self, name))
        _int("max_model_len", self.max_model_len, 1, optional=True)
        _choice("upstream_api", self.upstream_api, UPSTREAM_APIS)
        _choice("engine", self.engine, ENGINES, optional=True)
        if self.engine is not None and (self.base_url is not None or self.tokenizer is not None):
            raise PlanError("engine serves its own model: it excludes base_url and tokenizer")


@dataclass(frozen=True)
class SamplingOptions:
    """The sampling seed, and the temperature and tokens per turn that override the
    environment's own (None: the environment's)."""

    seed: int = 0
    temperature: float | None = None
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        _int("seed", self.seed, None)
        temperature = _number("temperature", self.temperature, optional=True)
        if temperature is not None and temperature < 0:
            raise PlanError(f"temperature must be >= 0, not {temperature}")
        _int("max_tokens", self.max_tokens, 1, optional=True)

    def overrides(self) -> dict[str, Any]:
        """The sampling parameters set here, as the rollouts send them."""
        out: dict[str, Any] = {}
        if self.temperature is not None:
            out["temperature"] = self.temperature
        if self.max_tokens is not None:
            out["max_tokens"] = self.max_tokens
        return out


@dataclass(frozen=True)
class ScaleOptions:
    """How much runs: ``n`` tasks (None: all) × ``r`` rollouts each, ``concurrency`` at
    once."""

    n: int | None = None
    r: int = 1
    concurrency: int = 8

    def __post_init__(self) -> None:
        _int("n", self.n, 0, optional=True)
        _int("r", self.r, 1)
        _int("concurrency", self.concurrency, 1)


@dataclass(frozen=True)
class SandboxOptions:
    """Where a command harness's agent runs (``runtime``: a name of ``RUNTIMES`` or a
    factory; None: the environment's choice), the host paths its sandbox binds read-only
    (``sandbox_paths`` also first on its PATH) and the phase deadlines (None: the
    environment's)."""

    runtime: str | RuntimeFactory | None = None
    ro_paths: tuple[str, ...] = ()
    sandbox_paths: tuple[str, ...] = ()
    timeouts: Timeouts | None = None

    def __post_init__(self) -> None:
        if isinstance(self.runtime, str):
            _choice("runtime", self.runtime, RUNTIMES)
        elif self.runtime is not None and not callable(self.runtime):
            raise PlanTypeError("runtime must be a runtime name or a factory, not "
                                f"{type(self.runtime).__name__}")
        _set(self, "ro_paths", _paths("ro_paths", self.ro_paths))
        _set(self, "sandbox_paths", _paths("sandbox_paths", self.sandbox_paths))
        if self.timeouts is not None and not isinstance(self.timeouts, Timeouts):
            raise PlanTypeError("timeouts must be a Timeouts or None, not "
                                f"{type(self.timeouts).__name__}")


@dataclass(frozen=True)
class PlacementOptions:
    """Where the rollouts run: ``backend`` ``local`` (this process) or ``process``/``ray``
    (``workers`` env-server workers: local processes, or Ray actors of ``worker_cpus``
    CPUs and ``worker_resources`` each on the cluster at ``ray_address``)."""

    backend: Backend | str = Backend.LOCAL
    workers: int = 2
    ray_address: str | None = None
    worker_cpus: float = 1.0
    worker_resources: Mapping[str, float] | None = None

    def __post_init__(self) -> None:
        _choice("backend", self.backend, BACKENDS)
        _int("workers", self.workers, 1)
        _text("ray_address", self.ray_address)
        cpus = _number("worker_cpus", self.worker_cpus)
        if cpus is None or cpus <= 0:
            raise PlanError(f"worker_cpus must be > 0, not {self.worker_cpus}")
        if self.worker_resources is not None:
            if not isinstance(self.worker_resources, Mapping):
                raise PlanTypeError("worker_resources must be a mapping of names to numbers")
            resources: dict[str, float] = {}
            for key, value in self.worker_resources.items():
                if not isinstance(key, str):
                    raise PlanTypeError(f"worker_resources key {key!r} is not a str")
                amount = _number(f"worker_resources[{key!r}]", value)
                assert amount is not None
                resources[key] = amount
            # A copy: the caller's mapping may change after the plan is made.
            _set(self, "worker_resources", resources)


@dataclass(frozen=True)
class OutputOptions:
    """Where the run is stored: ``out`` (None: ``runs/<env>-<timestamp>``); ``resume``
    continues the run already there, skipping its finished (task, rollout) pairs."""

    out: Path | None = None
    resume: bool = False

    def __post_init__(self) -> None:
        if self.out is not None:
            if not isinstance(self.out, (str, os.PathLike)):
                raise PlanTypeError(f"out must be a path or None, not {type(self.out).__name__}")
            _set(self, "out", Path(self.out))
        if not isinstance(self.resume, bool):
            raise PlanTypeError(f"resume must be a bool, not {type(self.resume).__name__}")
        if self.resume and self.out is None:
            raise PlanError("--resume needs --out (the run directory to continue)")


class EvalOptions(TypedDict, total=False):
    """The options of :func:`evaluate`, by name: each a field of one group of
    :class:`EvalPlan` (the same names, the same meanings)."""

    model: str | None
    base_url: str | None
    api_key: str | None
    max_model_len: int | None
    tokenizer: str | None
    upstream_api: str
    engine: str | None
    seed: int
    temperature: float | None
    max_tokens: int | None
    n: int | None
    r: int
    concurrency: int
    runtime: str | RuntimeFactory | None
    ro_paths: tuple[str, ...] | list[str]
    sandbox_paths: tuple[str, ...] | list[str]
    timeouts: Timeouts | None
    backend: Backend | str
    workers: int
    ray_address: str | None
    worker_cpus: float
    worker_resources: Mapping[str, float] | None
    out: str | Path | None
    resume: bool


#: Each group of an :class:`EvalPlan`: the plan's field and the group's class.
_GROUPS: dict[str, type[Any]] = {
    "model": ModelOptions, "sampling": SamplingOptions, "scale": ScaleOptions,
    "sandbox": SandboxOptions, "placement": PlacementOptions, "output": OutputOptions,
}
#: Option name -> the group holding it (no name is in two groups).
_OPTION_GROUP: dict[str, str] = {
    f.name: group for group, cls in _GROUPS.items() for f in dataclasses.fields(cls)
}


@dataclass(frozen=True)
class EvalPlan:
    """One eval: the environment (a reference :func:`tracewire.env.load_environment`
    resolves, or the environment itself) and its options in groups, each checked when made.
    Build one directly, or from :func:`evaluate`'s flat options with :meth:`from_options`.
    """

    env: str | Environment
    model: ModelOptions = field(default_factory=ModelOptions)
    sampling: SamplingOptions = field(default_factory=SamplingOptions)
    scale: ScaleOptions = field(default_factory=ScaleOptions)
    sandbox: SandboxOptions = field(default_factory=SandboxOptions)
    placement: PlacementOptions = field(default_factory=PlacementOptions)
    output: OutputOptions = field(default_factory=OutputOptions)

    def __post_init__(self) -> None:
        if isinstance(self.env, str):
            if not self.env.strip():
                raise PlanError("env must name an environment, not an empty string")
        elif not isinstance(self.env, Environment):
            raise PlanTypeError("env must be an environment reference (str) or an "
                                f"Environment, not {type(self.env).__name__}")
        for name, cls in _GROUPS.items():
            if not isinstance(getattr(self, name), cls):
                raise PlanTypeError(f"EvalPlan.{name} must be a {cls.__name__}, not "
                                    f"{type(getattr(self, name)).__name__}")

    @classmethod
    def from_options(cls, env: str | Environment, **options: Any) -> EvalPlan:
        """The plan of ``evaluate(env, **options)``: each option goes to its group; an
        unknown name is a :class:`~tracewire.PlanTypeError`."""
        unknown = sorted(set(options) - set(_OPTION_GROUP))
        if unknown:
            raise PlanTypeError(f"unknown eval option {unknown[0]!r} (known: "
                                f"{', '.join(_OPTION_GROUP)})")
        grouped: dict[str, dict[str, Any]] = {name: {} for name in _GROUPS}
        for name, value in options.items():
            grouped[_OPTION_GROUP[name]][name] = value
        return cls(env, **{name: _GROUPS[name](**kw) for name, kw in grouped.items()})

    def options(self) -> dict[str, Any]:
        """The plan's options by name, as :meth:`from_options` takes them (the environment
        left out)."""
        return {name: getattr(getattr(self, group), name)
                for name, group in _OPTION_GROUP.items()}
