#!/bin/bash
# Before/after in the same minutes: run each bench in tree A, then tree B (order flipped
# every round), appending JSON lines to OUT/<bench>-{a,b}.jsonl; summarize with
# `python bench/_compare.py OUT`. Each tree needs its own .venv (make .venv/.installed-stamp).
# Usage: bench/compare.sh TREE_A TREE_B OUT [ROUNDS]
set -u
A=$1 B=$2 OUT=$3 ROUNDS=${4:-2}
mkdir -p "$OUT"
run() { # bench tag dir args...
  local name=$1 tag=$2 dir=$3; shift 3
  (cd "$dir" && timeout 900 .venv/bin/python "bench/$name.py" "$@" >> "$OUT/$name-$tag.jsonl" 2>> "$OUT/$name-$tag.err")
}
for r in $(seq "$ROUNDS"); do
  for spec in "codec --runs 5" "samples --runs 9" "persist 3" "stall 3" "serve --runs 5 --episodes 200" "proxy"; do
    set -- $spec; name=$1; shift
    if [ $((r % 2)) = 1 ]; then run "$name" a "$A" "$@"; run "$name" b "$B" "$@"
    else run "$name" b "$B" "$@"; run "$name" a "$A" "$@"; fi
    echo "$(date +%T) round $r $name done"
  done
done
