"""Median of each (bench, case, metric) in two trees' JSON lines from ``bench/compare.sh``.

Usage: ``python bench/_compare.py OUT`` prints a markdown table, before (a) vs after (b).
"""

from __future__ import annotations

import collections
import json
import statistics
import sys
from pathlib import Path


def main(out: Path) -> None:
    found: dict[tuple[str, str, str], dict[str, list[float]]] = collections.defaultdict(
        lambda: collections.defaultdict(list))
    for f in sorted(out.glob("*.jsonl")):
        tag = f.stem.rsplit("-", 1)[1]
        for line in f.read_text().splitlines():
            if not line.startswith("{"):
                continue
            d = json.loads(line)
            if d.get("ours") is not None:
                found[(d["bench"], d["case"], d["metric"])][tag].append(float(d["ours"]))
    print("| bench · case | metric | before (a) | after (b) | after/before |")
    print("|---|---|---|---|---|")
    for (bench, case, metric), v in sorted(found.items()):
        if v.get("a") and v.get("b"):
            a, b = statistics.median(v["a"]), statistics.median(v["b"])
            ratio = f"{b / a:.2f}" if a else "—"
            print(f"| {bench} · {case} | {metric} | {a:.4g} ({len(v['a'])}) | "
                  f"{b:.4g} ({len(v['b'])}) | {ratio} |")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
