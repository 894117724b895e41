"""Finding an environment by name: bundled name, entry point, module path or file."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from .._errors import EnvError
from ._api import Environment

__all__ = ["BUNDLED", "ENTRY_POINT_GROUP", "load_environment"]

#: Bundled environment name -> module.
BUNDLED: dict[str, str] = {
    "arithmetic": "tracewire.env.bundled.arithmetic",
    "tools": "tracewire.env.bundled.tools",
    "guess": "tracewire.env.bundled.guess",
    "command": "tracewire.env.bundled.command",
}
#: Entry-point group under which installed packages advertise environments.
ENTRY_POINT_GROUP = "tracewire.environments"


def _from_object(obj: Any, where: str) -> Environment:
    if isinstance(obj, Environment):
        return obj
    if isinstance(obj, ModuleType):
        for attr in ("load_environment", "environment", "env"):
            if hasattr(obj, attr):
                return _from_object(getattr(obj, attr), f"{where}.{attr}")
        found = [v for v in vars(obj).values() if isinstance(v, Environment)]
        if len(found) == 1:
            return found[0]
        raise EnvError(
            f"{where} defines no environment (expected load_environment(), `environment` "
            "or exactly one Environment)"
        )
    if callable(obj):
        try:
            made = obj()
        except Exception as exc:
            raise EnvError(f"{where}() failed: {type(exc).__name__}: {exc}") from exc
        if isinstance(made, Environment):
            return made
        raise EnvError(f"{where}() returned {type(made).__name__}, not an Environment")
    raise EnvError(f"{where} is a {type(obj).__name__}, not an Environment")


def _import(module: str, name: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and module.startswith(exc.name):
            raise EnvError(
                f"unknown environment {name!r} (not bundled: {', '.join(BUNDLED)}; "
                f"no module {exc.name!r})"
            ) from exc
        raise EnvError(f"cannot import {module!r}: {exc}") from exc
    except Exception as exc:
        raise EnvError(f"importing {module!r} failed: {type(exc).__name__}: {exc}") from exc


def _load_file(path: Path) -> ModuleType:
    mod_name = f"_tracewire_env_{path.stem}"
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise EnvError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(mod_name, None)
        raise EnvError(f"loading {path} failed: {type(exc).__name__}: {exc}") from exc
    return module


def load_environment(name: str | Environment) -> Environment:
    """The environment called ``name``: a bundled name, an entry point in the
    ``tracewire.environments`` group, ``pkg.module`` / ``pkg.module:attr``, or a ``.py`` file.

    Raises :class:`tracewire.EnvError` with a one-line reason when none is found.
    """
    if isinstance(name, Environment):
        return name
    name = name.strip()
    if not name:
        raise EnvError("empty environment name")
    env = _find(name)
    if env.ref is None:
        env.ref = name  # env-server workers load it again by this reference
    return env


def _find(name: str) -> Environment:
    if name in BUNDLED:
        return _from_object(_import(BUNDLED[name], name), name)
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            try:
                obj = ep.load()
            except Exception as exc:
                raise EnvError(f"entry point {name!r} failed to load: {exc}") from exc
            return _from_object(obj, name)
    module, _, attr = name.partition(":")
    if module.endswith(".py") or "/" in module:
        path = Path(module)
        if not path.is_file():
            raise EnvError(f"unknown environment {name!r}: no file {path}")
        mod = _load_file(path)
    else:
        mod = _import(module, name)
    if attr:
        if not hasattr(mod, attr):
            raise EnvError(f"module {module!r} has no attribute {attr!r}")
        return _from_object(getattr(mod, attr), name)
    return _from_object(mod, name)
