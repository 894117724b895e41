"""An eval on a local engine (``evaluate(..., engine="llamacpp")``): start llama.cpp's server
on the GGUF model, serve the rollouts token-in/token-out over it, stop it afterwards.

The GGUF file is both the engine's model and the proxy's tokenizer (its vocabulary, merges
and chat template), and ids go to the server's native ``/completion`` (``llamacpp``): the
proxy renders every prompt itself, so the trace holds exactly the ids the model saw and
sampled.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TypeVar

from ..engine import LlamaServer
from ._options import ENGINES, RolloutPlan

__all__ = ["ENGINES", "with_engine"]

T = TypeVar("T")

#: The token-in endpoint each engine is asked on (a ``tito.codecs.UpstreamApi`` value).
_UPSTREAM_API = {"llamacpp": "llamacpp"}


@contextlib.asynccontextmanager
async def with_engine(plan: RolloutPlan,
                      inner: Callable[[RolloutPlan], contextlib.AbstractAsyncContextManager[T]]
                      ) -> AsyncIterator[T]:
    """Start ``plan.engine`` on ``plan.engine_model`` (default: the bundled model), enter
    ``inner`` with a plan pointing at it token-in/token-out, and stop the engine after."""
    if plan.engine not in ENGINES:
        raise ValueError(f"unknown engine {plan.engine!r} (known: {', '.join(ENGINES)})")
    if plan.base_url is not None or plan.tokenizer is not None:
        raise ValueError("an engine serves its own model: drop base_url and tokenizer")
    model = Path(plan.engine_model) if plan.engine_model else None
    async with LlamaServer(model, parallel=plan.engine_parallel) as server:
        assert server.model is not None
        served = dataclasses.replace(
            plan, engine=None, base_url=server.url + "/v1", tokenizer=str(server.model),
            upstream_api=_UPSTREAM_API[plan.engine], model=plan.model or server.model.stem)
        async with inner(served) as backend:
            yield backend
