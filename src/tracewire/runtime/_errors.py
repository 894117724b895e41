"""The runtime part's base errors and size check (imported by the API and the file mover)."""

from __future__ import annotations

from .._errors import EnvError, LimitError

__all__ = ["RuntimeUnavailable", "SandboxError", "check_size"]


class SandboxError(EnvError):
    """A runtime failed to boot, run a command, move files or clean up."""


class RuntimeUnavailable(SandboxError):
    """The runtime cannot run on this machine (tool missing, not permitted, no daemon)."""


def check_size(n: int, limit: int, what: str) -> None:
    """Raise ``LimitError`` when ``n`` is over ``limit``."""
    if n > limit:
        raise LimitError(f"{what}: {n} bytes over the {limit}-byte limit")
