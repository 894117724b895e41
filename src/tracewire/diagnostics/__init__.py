"""Diagnostics of the running process: how late the event loop's timers fire, and why.

Used by ``tracewire eval`` (the summary's loop lag) and by the benches; it depends on no
other part.
"""

from ._probe import LoopLagProbe

__all__ = ["LoopLagProbe"]
