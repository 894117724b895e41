"""Test agent (stdlib only): look for the canary read from stdin (not argv, where it would
find itself) everywhere this process can read: its
environment, every ``/proc/*/environ`` and ``/proc/*/cmdline``, and every regular file
under ``argv[2:]`` (files whose mtime and ctime are older than ``argv[1]``, a Unix time,
are skipped: the canary did not exist then; the writable dirs are read whatever their age).
Prints ``{"found": [...], "files": N, "procs": N}``."""

from __future__ import annotations

import json
import os
import stat
import sys

SKIP = ("/proc", "/sys", "/dev")
ALWAYS = ("/tmp", "/workspace", "/etc", "/run")


def main() -> None:
    canary = sys.stdin.buffer.read().strip()
    since, roots = float(sys.argv[1]), sys.argv[2:]
    assert len(canary) > 16
    found: list[str] = []
    found += [f"env:{k}" for k, v in os.environ.items() if canary in (k + v).encode()]
    procs = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        procs += 1
        for what in ("environ", "cmdline"):
            try:
                with open(f"/proc/{pid}/{what}", "rb") as f:
                    if canary in f.read():
                        found.append(f"/proc/{pid}/{what}")
            except OSError:
                pass
    files = 0
    for root in roots:
        for d, dirs, names in os.walk(root):
            dirs[:] = [x for x in dirs if os.path.join(d, x) not in SKIP]
            for n in names:
                p = os.path.join(d, n)
                try:
                    st = os.lstat(p)
                except OSError:
                    continue
                if not stat.S_ISREG(st.st_mode):
                    continue
                if max(st.st_mtime, st.st_ctime) < since and not p.startswith(ALWAYS):
                    continue
                files += 1
                try:
                    with open(p, "rb") as f:
                        if canary in f.read(1 << 22):
                            found.append(p)
                except OSError:
                    pass
    print(json.dumps({"found": found, "files": files, "procs": procs}), flush=True)


if __name__ == "__main__":
    main()
