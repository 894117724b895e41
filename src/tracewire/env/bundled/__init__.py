"""Bundled environments: ``arithmetic``, ``tools``, ``guess`` and ``command``.

Each module defines ``load_environment() -> Environment``; load one with
``tracewire.env.load_environment("guess")``. Their task data and the exact prompt and
feedback formats (which the built-in model was trained on) are in ``data/`` next to them.
"""

__all__: list[str] = []
