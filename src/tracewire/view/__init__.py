"""Live web viewer of a run: episode index, episodes, token view and timing, over aiohttp.

``tracewire view RUN_DIR`` serves it; :class:`ViewServer` and :func:`build_app` embed it.
"""

from ._app import build_app
from ._cli import COMMAND
from ._server import ViewServer

__all__ = ["COMMAND", "ViewServer", "build_app"]
