"""Servers we start as children (the built-in model, llama-server) must not outlive us.

A clean stop terminates them; a SIGKILLed parent cannot, so on Linux the child asks the
kernel for SIGTERM when its parent dies (``PR_SET_PDEATHSIG``), set between fork and exec.
"""

from __future__ import annotations

import ctypes
import signal
import sys

__all__ = ["die_with_parent"]

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """``preexec_fn`` for a child that must end with its parent (a no-op off Linux). The
    signal comes when the thread that started the child exits, so start servers from the
    thread that lives as long as they should (the event loop's, the main thread)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))
    except (OSError, AttributeError):
        pass  # best effort: the clean-stop path still terminates the child
