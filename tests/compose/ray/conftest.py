"""The eval's Ray suite: one Ray instance for the session, inside the namespace that
``tests/compose/test_eval_ray.py`` made (holding only ``lo``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.serve.ray.conftest import only_loopback


@pytest.fixture(scope="session")
def ray_instance() -> Iterator[Any]:
    only_loopback()
    import ray

    # "local": a new instance; 4 logical CPUs let a few 1-CPU actors share 2 cores.
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()
