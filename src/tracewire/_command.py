"""The shape of a ``tracewire`` sub-command, which each part exports for the command line,
and the option parsers more than one sub-command shares."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable

__all__ = ["Command", "parse_worker_resources"]


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


def parse_worker_resources(text: str | None) -> dict[str, float] | None:
    """``--worker-resources`` (``tracewire serve`` and ``eval``): custom Ray resources per
    worker, a JSON object of numbers; None stays None, anything else is a ``ValueError``."""
    if text is None:
        return None
    # Imported here: every ``tracewire`` start imports this module to build its parser.
    import msgspec

    try:
        return msgspec.json.decode(text, type=dict[str, float])
    except msgspec.DecodeError as exc:
        raise ValueError(f"--worker-resources is not a JSON object of numbers: {exc}") from exc
