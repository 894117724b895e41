"""The options an eval's rollouts share, and the names of the backends that run them.

Kept apart from the backends themselves so the command line can list them without
importing the parts they wire.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ..env import Timeouts

__all__ = ["BACKENDS", "UPSTREAM_APIS", "Backend", "RolloutPlan"]

#: Where an eval's rollouts run: ``local`` is this process.
Backend = Literal["local"]
#: Every :data:`Backend`, for the command line's choices.
BACKENDS: tuple[Backend, ...] = ("local",)
#: Token-in endpoints ``--upstream-api`` accepts (the values of ``tito.codecs.UpstreamApi``).
UPSTREAM_APIS = ("completions", "generate", "sglang")


@dataclass(frozen=True)
class RolloutPlan:
    """What every rollout of an eval shares: the model server, sampling and deadlines."""

    base_url: str | None = None
    model: str | None = None
    api_key: str | None = None
    seed: int = 0
    max_model_len: int | None = None
    sampling: Mapping[str, Any] = field(default_factory=dict)
    timeouts: Timeouts | None = None
    #: Token-in/token-out: a local tokenizer directory and the endpoint to send ids to
    #: (see ``ProxyConfig.tokenizer``); None keeps the chat pass-through.
    tokenizer: str | None = None
    upstream_api: str = "completions"
