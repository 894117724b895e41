"""Everything the train loop takes from other parts, in one place.

The session API is moving out of ``tracewire.samples`` (into the proxy); only this module
names where the pieces live, so re-pointing an import is a one-line change here.
"""

from __future__ import annotations

from ..env import Environment, Task, close_http_client, load_environment, run_rollout
from ..model import (
    MODEL_NAME,
    ChatTemplate,
    Engine,
    ModelServer,
    Policy,
    Rescored,
    get_engine,
    rescore,
)
from ..proxy import Proxy
from ..samples import Sample, assemble, decode_samples, encode_samples
from ..store import Run, RunWriter
from ..trace import Episode

__all__ = [
    "MODEL_NAME",
    "ChatTemplate",
    "Engine",
    "Environment",
    "Episode",
    "ModelServer",
    "Policy",
    "Proxy",
    "Rescored",
    "Run",
    "RunWriter",
    "Sample",
    "Task",
    "assemble",
    "close_http_client",
    "decode_samples",
    "encode_samples",
    "get_engine",
    "load_environment",
    "rescore",
    "run_rollout",
]
