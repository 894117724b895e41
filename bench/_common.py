"""Shared helpers for benches: timing medians and the JSON-line output format."""

from __future__ import annotations

import gc
import json
import statistics
import time
from collections.abc import Callable
from typing import Any


def median_ms(fn: Callable[[], Any], runs: int, *, setup: Callable[[], Any] | None = None) -> float:
    """Median wall time of ``fn()`` in milliseconds over ``runs`` calls (GC off while timed)."""
    times = []
    for _ in range(runs):
        if setup is not None:
            setup()
        gc.collect()
        gc.disable()
        try:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        finally:
            gc.enable()
    return statistics.median(times)


def emit(
    bench: str,
    case: str,
    metric: str,
    unit: str,
    ours: float,
    baseline: float | None,
    better: str,
    runs: int,
) -> None:
    """Print one figure as a JSON line; ratio > 1 always means tracewire is ahead."""
    ratio = None
    if baseline is not None and ours and baseline:
        ratio = baseline / ours if better == "lower" else ours / baseline
    print(
        json.dumps(
            {
                "bench": bench,
                "case": case,
                "metric": metric,
                "unit": unit,
                "ours": round(ours, 4),
                "baseline": None if baseline is None else round(baseline, 4),
                "ratio": None if ratio is None else round(ratio, 2),
                "better": better,
                "runs": runs,
            }
        ),
        flush=True,
    )
