"""The harness base class: what drives the model during a rollout's agent phase.

A harness's ``boot`` runs in the rollout's boot phase, ``run`` is the agent phase, and
``cleanup`` runs once the rollout is over, whatever happened (also after a failed boot
that got as far as making the rollout).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._context import Rollout

__all__ = ["Harness"]


class Harness(ABC):
    """Drives the model for one rollout, only through ``rollout``'s proxy session.

    Subclasses implement :meth:`run`; :meth:`boot` and :meth:`cleanup` do nothing unless
    overridden.
    """

    #: Short name recorded in ``trace.agent["harness"]`` (``chat``, ``tools``, ``command``).
    kind: str = "custom"
    #: Whether the agent uses this process's ``openai`` SDK (then the rollout gets the shared
    #: HTTP client, ``rollout.http``); False for agents in other processes.
    uses_sdk: bool = True

    async def boot(self, rollout: Rollout) -> None:  # noqa: B027 - optional hook
        """Prepare the rollout before the environment's setup (e.g. a scratch directory)."""

    @abstractmethod
    async def run(self, rollout: Rollout) -> None:
        """Run the agent until done; set ``rollout.stop(reason)`` to name how it ended."""

    async def cleanup(self, rollout: Rollout) -> None:  # noqa: B027 - optional hook
        """Release what :meth:`boot` made; runs after every rollout that was booted."""
