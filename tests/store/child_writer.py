"""Child process for the crash tests: appends episodes and prints each id once acknowledged.

Usage: child_writer.py RUN_DIR FIRST_SEED COUNT TURNS TOKENS FSYNC [--journal] [--fsize N]
   or: child_writer.py --zygote   (reads such argument lines on stdin and forks one writer
       process per line, already past the imports: prints "pid P", the writer's lines, and
       "exit P STATUS" once that process is gone)
"""

from __future__ import annotations

import asyncio
import os
import resource
import signal
import sys

sys.path.insert(0, os.path.dirname(__file__))

from helpers import add_turn, build

from tracewire import Episode, StoreError
from tracewire.store import Run


async def main(argv: list[str]) -> None:
    run_dir, first, count, turns, ntok, fsync = argv[:6]
    flags = argv[6:]
    if "--fsize" in flags:
        limit = int(flags[flags.index("--fsize") + 1])
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get EFBIG instead of dying
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    resume = os.path.exists(run_dir + "/meta.json")  # noqa: ASYNC240 - before any work
    run = await Run.create(run_dir, fsync=fsync, resume=resume)
    print("ready", flush=True)
    failures = 0
    for seed in range(int(first), int(first) + int(count)):
        if "--journal" in flags:
            ep = Episode(env="test", task_key=f"task-{seed}", task={"seed": seed})
            ep.info["seed"], ep.info["n"] = seed, int(ntok)
            ep.new_trace()
            j = run.journal(ep)
            for k in range(int(turns)):
                add_turn(ep, seed, k, int(ntok))
                ep.traces[0].notify()
            await run.flush()
            print(f"journaled {ep.id}", flush=True)
            tr = ep.traces[0]
            tr.set_reward("correct", float(seed % 2))
            tr.metrics["turns"] = float(turns)
            tr.stop, tr.completed = "done", True
            j.update()
        else:
            ep = build(seed, int(turns), int(ntok))
        try:
            await run.append(ep)
        except StoreError as exc:
            print(f"storeerror {exc.errno} {exc}", flush=True)
            failures += 1
            if failures >= 3:
                break
            continue
        print(f"acked {ep.id}", flush=True)
    await run.close()
    print("closed", flush=True)


def zygote() -> None:
    for line in sys.stdin:
        argv = line.split()
        if not argv:
            break
        pid = os.fork()
        if pid == 0:
            try:
                asyncio.run(main(argv))
            finally:
                sys.stdout.flush()
                os._exit(0)
        print(f"pid {pid}", flush=True)
        _, status = os.waitpid(pid, 0)
        # A writer killed in the middle of a print leaves a line without its newline: start
        # on a fresh line so "exit" never glues onto it (the reader skips blank lines).
        print(f"\nexit {pid} {status}", flush=True)


if sys.argv[1:] == ["--zygote"]:
    zygote()
else:
    asyncio.run(main(sys.argv[1:]))
