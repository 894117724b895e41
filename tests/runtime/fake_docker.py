"""A stand-in for the ``docker`` CLI and its daemon, for tests on machines where no daemon
can run: installed as ``docker`` first on ``PATH`` by the test (see
``test_docker_reap.install_fake_docker``), it appends each command line to
``$FAKE_DOCKER_LOG`` (one JSON list a line) and answers from the containers in
``$FAKE_DOCKER_STATE`` (a JSON file it keeps under an ``flock``).

What it answers: ``info``, ``image inspect``; ``run -d --name N … --label K=V …`` (records
a container, prints its id); ``ps -a -q --filter label=K[=V]…`` (ids of the containers
with every label); ``inspect ID…`` (their ``Id``, ``Name`` and ``Config.Labels``, exit 1
naming any missing); ``rm -f REF…`` (by id, id prefix or name; exit 1 naming any
missing); ``exec … NAME CMD…`` (a command whose last word mentions ``sleep`` stands for a
long-running one: the client waits until its container is removed, then exits 137, as a
real ``docker exec`` client does, or 124 after two minutes; others exit 0 at once).
Stdlib only.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import sys
import time
from collections.abc import Iterator
from typing import Any

STATE = os.environ["FAKE_DOCKER_STATE"]
LOG = os.environ["FAKE_DOCKER_LOG"]
#: ``run`` options that take a value (the rest are flags), as the runtime passes them.
_RUN_VALUES = {"--name", "--network", "--cap-drop", "--security-opt", "--tmpfs", "-v", "-w",
               "--label", "--entrypoint", "--memory", "--memory-swap", "--pids-limit",
               "--ulimit"}


@contextlib.contextmanager
def _state() -> Iterator[dict[str, Any]]:
    with open(STATE + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            with open(STATE) as f:
                state = json.load(f)
        except FileNotFoundError:
            state = {"containers": []}
        yield state
        tmp = STATE + ".new"
        with open(tmp, "w") as f:
            json.dump(state, f)
        os.replace(tmp, STATE)


def _find(state: dict[str, Any], ref: str) -> dict[str, Any] | None:
    for c in state["containers"]:
        if ref in (c["Id"], c["Name"]) or (len(ref) >= 12 and c["Id"].startswith(ref)):
            return c  # type: ignore[no-any-return]
    return None


def _run(args: list[str]) -> int:
    name, labels, i = "", {}, 0
    while i < len(args) and args[i].startswith("-"):
        if args[i] in _RUN_VALUES:
            if args[i] == "--name":
                name = args[i + 1]
            elif args[i] == "--label":
                k, _, v = args[i + 1].partition("=")
                labels[k] = v
            i += 2
        else:
            i += 1
    cid = secrets.token_hex(32)
    with _state() as state:
        state["containers"].append({"Id": cid, "Name": name or cid[:12], "Labels": labels,
                                    "Image": args[i] if i < len(args) else ""})
    print(cid)
    return 0


def _ps(args: list[str]) -> int:
    wanted = [args[i + 1].removeprefix("label=") for i, a in enumerate(args)
              if a == "--filter" and args[i + 1].startswith("label=")]
    with _state() as state:
        for c in state["containers"]:
            ok = True
            for w in wanted:
                k, eq, v = w.partition("=")
                ok = ok and k in c["Labels"] and (not eq or c["Labels"][k] == v)
            if ok:
                print(c["Id"][:12])
    return 0


def _inspect(refs: list[str]) -> int:
    found, code = [], 0
    with _state() as state:
        for r in refs:
            c = _find(state, r)
            if c is None:
                print(f"Error: No such object: {r}", file=sys.stderr)
                code = 1
            else:
                found.append({"Id": c["Id"], "Name": "/" + c["Name"],
                              "Config": {"Labels": c["Labels"], "Image": c["Image"]}})
    print(json.dumps(found, indent=4))
    return code


def _rm(refs: list[str]) -> int:
    code = 0
    with _state() as state:
        for r in refs:
            c = _find(state, r)
            if c is None:
                print(f"Error response from daemon: No such container: {r}", file=sys.stderr)
                code = 1
            else:
                state["containers"].remove(c)
                print(r)
    return code


def _exec(args: list[str]) -> int:
    i = 0
    while args[i].startswith("-"):
        i += 2 if args[i] in ("-w", "-e") else 1
    name, cmd = args[i], args[i + 1:]
    with _state() as state:
        if _find(state, name) is None:
            print(f"Error response from daemon: No such container: {name}", file=sys.stderr)
            return 1
    if not cmd or "sleep" not in cmd[-1]:
        return 0
    # Bounded, so a test that fails to remove the container leaves no client for long.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        time.sleep(0.05)
        with _state() as state:
            if _find(state, name) is None:
                return 137
    return 124


def main(argv: list[str]) -> int:
    with open(LOG, "a") as f:
        f.write(json.dumps(argv) + "\n")
    cmd, args = (argv[0], argv[1:]) if argv else ("", [])
    if cmd == "info":
        return 0
    if cmd == "image" and args[:1] == ["inspect"]:
        return 0
    if cmd == "run":
        return _run(args)
    if cmd == "ps":
        return _ps(args)
    if cmd == "inspect":
        return _inspect(args)
    if cmd == "rm":
        return _rm([a for a in args if a != "-f"])
    if cmd == "exec":
        return _exec(args)
    print(f"fake docker: {cmd!r} is not something it answers", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
