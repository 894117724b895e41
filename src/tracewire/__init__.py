"""tracewire: token-exact recording of LLM agent rollouts, streamed, stored and viewed.

The public API is re-exported here; everything else is private. Heavier parts (proxy,
store, env server, viewer) load lazily on first attribute access so ``import tracewire``
stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._errors import (
    BusyError,
    CorruptRecordError,
    DecodeError,
    DeltaError,
    EnvError,
    HookError,
    LimitError,
    ModelError,
    PhaseTimeout,
    PlanError,
    PlanTypeError,
    ProtocolError,
    ProxyError,
    RunTimeout,
    SampleError,
    SchemaVersionError,
    ServeError,
    SessionError,
    StoreError,
    TracewireError,
    UpstreamConfigError,
    UpstreamError,
    WorkerDiedError,
)
from ._version import __version__
from .trace import (
    SCHEMA_VERSION,
    Branch,
    Call,
    Columns,
    Episode,
    ErrorInfo,
    Link,
    Message,
    Node,
    Reward,
    Span,
    ToolCall,
    Trace,
)

if TYPE_CHECKING:  # the same names the lazy loader below resolves, typed for mypy users
    from . import codec
    from .compose import evaluate
    from .diagnostics import LoopLagProbe
    from .env import Environment
    from .model import ModelServer
    from .proxy import Proxy
    from .serve import EnvClient
    from .sessions import SessionClient
    from .store import Run, RunReader, RunWriter, open_run

# name -> module; resolved on first access (PEP 562).
_LAZY: dict[str, str] = {
    "codec": "tracewire.codec",
    "open_run": "tracewire.store",
    "Run": "tracewire.store",
    "RunReader": "tracewire.store",
    "RunWriter": "tracewire.store",
    "LoopLagProbe": "tracewire.diagnostics",
    "ModelServer": "tracewire.model",
    "Proxy": "tracewire.proxy",
    "SessionClient": "tracewire.sessions",
    "Environment": "tracewire.env",
    "evaluate": "tracewire.compose",
    "EnvClient": "tracewire.serve",
}

__all__ = [
    "SCHEMA_VERSION",
    "Branch",
    "BusyError",
    "Call",
    "Columns",
    "CorruptRecordError",
    "DecodeError",
    "DeltaError",
    "EnvClient",
    "EnvError",
    "Environment",
    "Episode",
    "ErrorInfo",
    "HookError",
    "LimitError",
    "Link",
    "LoopLagProbe",
    "Message",
    "ModelError",
    "ModelServer",
    "Node",
    "PhaseTimeout",
    "PlanError",
    "PlanTypeError",
    "ProtocolError",
    "Proxy",
    "ProxyError",
    "Reward",
    "Run",
    "RunReader",
    "RunTimeout",
    "RunWriter",
    "SampleError",
    "SchemaVersionError",
    "ServeError",
    "SessionClient",
    "SessionError",
    "Span",
    "StoreError",
    "ToolCall",
    "Trace",
    "TracewireError",
    "UpstreamConfigError",
    "UpstreamError",
    "WorkerDiedError",
    "__version__",
    "codec",
    "evaluate",
    "open_run",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tracewire' has no attribute {name!r}")
    mod = importlib.import_module(module)
    value = mod if module.endswith(name) else getattr(mod, name)
    globals()[name] = value
    return value
