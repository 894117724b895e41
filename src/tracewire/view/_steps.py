"""Per-step numbers of a train run for the reward-over-steps plot.

``tracewire train`` writes one JSON line per step to ``<run>/train_steps.jsonl`` (reward,
mismatch, staleness ...); when it is there the plot uses it, else the mean reward per
``step`` value of the index. Read in a worker thread, bounded, bad lines skipped (a line
being written while we read is simply not there yet).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import orjson

from ._index import IndexTable

__all__ = ["MAX_STEPS_BYTES", "SERIES", "STEPS_FILE", "train_steps"]

#: The per-step summary file ``tracewire train`` writes in the run directory.
STEPS_FILE = "train_steps.jsonl"
#: Most bytes of it read (the tail is left out beyond that; ~100k steps).
MAX_STEPS_BYTES = 32 * 1024 * 1024
#: Series taken from the file: its field -> name in the answer.
SERIES = {"reward_mean": "reward", "mismatch_max": "mismatch_max", "mismatch_kl": "mismatch_kl",
          "staleness": "staleness"}


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return float(v) if math.isfinite(v) else None


def _from_file(path: Path) -> dict[str, Any] | None:
    try:
        with path.open("rb") as f:
            data = f.read(MAX_STEPS_BYTES)
    except FileNotFoundError:
        return None
    rows: dict[int, dict[str, Any]] = {}
    for line in data.splitlines():
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("step"), int):
            rows[obj["step"]] = obj  # a repeated step (resume) keeps its last line
    if not rows:
        return None
    steps = sorted(rows)
    out: dict[str, Any] = {"source": STEPS_FILE, "step": steps,
                           "n": [_num(rows[s].get("episodes")) for s in steps]}
    for field, name in SERIES.items():
        values = [_num(rows[s].get(field)) for s in steps]
        if any(v is not None for v in values):
            out[name] = values
    return out


def train_steps(run_dir: Path, index: IndexTable) -> dict[str, Any]:
    """``{"source", "step": [...], "reward": [...], "n": [...], ...}``: the file's series
    (``mismatch_max``, ``mismatch_kl``, ``staleness`` when present) or the index's mean
    reward (and ``tito_mismatch``) per step; ``source: null`` when the run has no steps."""
    found = _from_file(run_dir / STEPS_FILE)
    if found is not None:
        return found
    got = index.by_step()
    return {"source": "index" if got["step"] else None, **got}
