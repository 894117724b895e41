"""Runs the eval's Ray suite (tests/compose/ray) inside a private network namespace.

Launched like the serve part's Ray suite (``tests/serve/test_ray.py``): one child pytest
under ``unshare --net`` holding only ``lo``, passing only if every child test ran and
passed; skipped, with the reason, where Ray is missing or the namespace cannot be made.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.serve.test_ray import run_in_netns


@pytest.mark.slow
def test_eval_on_ray_in_a_private_namespace(tmp_path: Path) -> None:
    run_in_netns(tmp_path, "tests/compose/ray/test_ray_eval.py", limit=420)
