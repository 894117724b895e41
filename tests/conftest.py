"""Test lanes: markers given by where a test lives, so ``make test-fast`` can leave out what
needs an outside program or minutes (``make test`` still runs everything).

``ray`` (a Ray cluster), ``realmodel`` (llama.cpp and a GGUF model), ``sandbox`` (bwrap or
docker), ``agent`` (agent CLIs and the Node SDK), ``browser`` (Chromium; marked in the
tests themselves), ``slow`` (crash, fuzz and bit-flip sweeps, big indexes, a second mypy
run: each worth its seconds in the full lane only).
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent

#: Marker -> test paths (a folder or a file, relative to tests/) that get it.
LANES: dict[str, tuple[str, ...]] = {
    "ray": ("serve/ray", "compose/ray", "serve/test_ray.py", "compose/test_eval_ray.py"),
    "realmodel": ("realmodel",),
    "sandbox": ("runtime/test_bwrap.py", "runtime/test_docker.py"),
    "agent": ("examples", "runtime/test_presets.py", "proxy/test_stream_usage.py"),
    "slow": ("test_typed_facade.py", "proxy/test_fuzz.py", "store/test_crash.py",
             "store/test_trust.py", "view/test_crashed.py", "view/test_api_scale.py"),
}
#: Single tests of the slow lane, by file and name (their files are otherwise quick).
SLOW_TESTS = {
    ("proxy/test_server.py", "test_many_sessions_concurrently"),
    ("store/test_check.py", "test_seeded_bit_flips_in_the_index_are_caught_or_raise_store_error"),
    ("train/test_loop.py", "test_on_policy_mismatch_is_exactly_zero"),
}


def _lanes(rel: str, name: str) -> list[str]:
    out = [lane for lane, paths in LANES.items()
           if any(rel == p or rel.startswith(p + "/") for p in paths)]
    if (rel, name) in SLOW_TESTS:
        out.append("slow")
    return out


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        try:
            rel = item.path.resolve().relative_to(ROOT).as_posix()
        except ValueError:
            continue
        name = getattr(item, "originalname", None) or item.name
        for lane in _lanes(rel, name):
            item.add_marker(getattr(pytest.mark, lane))
        # A test that runs an agent inside bwrap carries runtime's `needs_bwrap` skip mark,
        # whose reason starts "bwrap:" whether or not bwrap is usable here.
        if any(str(m.kwargs.get("reason", "")).startswith("bwrap:")
               for m in item.iter_markers("skipif")):
            item.add_marker(pytest.mark.sandbox)
