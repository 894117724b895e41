"""The viewer app's shared state keys (one module, so route modules need not import the app)."""

from __future__ import annotations

from aiohttp import web

from ._live import LiveFeed
from ._runs import RunRegistry
from ._source import RunSource

__all__ = ["FEED", "RUNS", "SOURCE", "STATIC"]

SOURCE = web.AppKey("source", RunSource)
FEED = web.AppKey("feed", LiveFeed)
STATIC = web.AppKey("static", dict)
RUNS = web.AppKey("runs", RunRegistry)
