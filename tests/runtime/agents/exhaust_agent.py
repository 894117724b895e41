"""Test agent (stdlib only): exhaust the sandbox's process limit with sleeping children,
make a model call while exhausted, free the children, make another; print what happened
as one JSON line. ``argv[1]``: the model name."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import urllib.error
import urllib.request


def call(model: str) -> dict[str, object]:
    req = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=json.dumps({"model": model, "max_tokens": 8,
                         "messages": [{"role": "user", "content": "hi"}]}).encode(),
        headers={"Content-Type": "application/json",
                 "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return {"status": r.status, "s": time.monotonic() - t0}
    except urllib.error.HTTPError as exc:
        return {"status": exc.code, "body": exc.read().decode()[:300]}
    except OSError as exc:  # a hang ends here as a timeout
        return {"status": None, "error": f"{type(exc).__name__}: {exc}"}


def main() -> None:
    model = sys.argv[1]
    kids = []
    while True:
        try:
            pid = os.fork()
        except OSError:
            break  # EAGAIN: the cgroup's pids.max is reached
        if pid == 0:
            signal.pause()
            os._exit(0)
        kids.append(pid)
        if len(kids) > 10000:
            break
    during = call(model)
    for pid in kids:
        os.kill(pid, signal.SIGKILL)
    for pid in kids:
        os.waitpid(pid, 0)
    after = call(model)
    print(json.dumps({"children": len(kids), "during": during, "after": after}), flush=True)


if __name__ == "__main__":
    main()
