"""Fixtures of the composition-root tests."""

from __future__ import annotations

import os

# Ray listens on every interface it sees: the eval's Ray tests (ray/) run only inside the
# private network namespace that test_eval_ray.py creates for them (TRACEWIRE_NETNS set).
if os.environ.get("TRACEWIRE_NETNS") != "1":
    collect_ignore = ["ray"]
