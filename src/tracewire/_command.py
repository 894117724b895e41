"""The shape of a ``tracewire`` sub-command, which each part exports for the command line."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable

__all__ = ["Command"]


@dataclasses.dataclass(frozen=True, slots=True)
class Command:
    """A sub-command: its ``name``, one-line ``help``, ``configure(parser)`` adding its
    arguments, and ``run(args)`` returning the process exit status."""

    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]

    def with_run(self, run: Callable[[argparse.Namespace], int]) -> Command:
        """The same command running ``run`` (the composition root injects what it wires)."""
        return dataclasses.replace(self, run=run)
