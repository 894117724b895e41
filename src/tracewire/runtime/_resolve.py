"""Finding an agent's executable on the host and what a sandbox must bind for it to run:
the directory it is found in (put on the sandbox's ``PATH``), the install tree its real
file lives in (an npm package, a virtual environment, an interpreter's prefix) and,
through its ``#!`` line, its interpreter (``node``, ``python``), found the same way.

A CLI installed under an npm prefix, nvm or ``~/.npm-global`` is a link in a ``bin``
directory to a script inside ``lib/node_modules/<pkg>``, run by a ``node`` that may live
elsewhere again; binding only ``/usr`` (the sandbox's default) finds none of them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ._errors import SandboxError

__all__ = ["Exposure", "expose"]

_MARKERS = ("package.json", "pyvenv.cfg")
_MAX_UP = 6


@dataclass
class Exposure:
    """Host directories to bind read-only, and directories to put on the sandbox PATH."""

    binds: list[str] = field(default_factory=list)
    path: list[str] = field(default_factory=list)
    found: dict[str, str] = field(default_factory=dict)

    def add(self, binds: Sequence[str] = (), path: Sequence[str] = ()) -> None:
        """Add what is not there yet, keeping order."""
        for b in binds:
            if b not in self.binds:
                self.binds.append(b)
        for p in path:
            if p not in self.path:
                self.path.append(p)


def _homes() -> set[str]:
    homes = {os.path.realpath(os.path.expanduser("~")), "/root", "/home"}
    try:
        homes.update(os.path.join("/home", n) for n in os.listdir("/home"))
    except OSError:
        pass
    return homes


def _tree_of(real: str) -> str:
    """The install tree holding ``real``: the nearest ancestor with a ``package.json`` or
    ``pyvenv.cfg``, else the prefix above a ``bin`` directory, else its own directory;
    never ``/`` or a home directory itself (that would expose the user's files)."""
    here = os.path.dirname(real)
    d = here
    for _ in range(_MAX_UP):
        if any(os.path.isfile(os.path.join(d, m)) for m in _MARKERS):
            break
        parent = os.path.dirname(d)
        if parent == d:
            d = ""
            break
        d = parent
    else:
        d = ""
    if not d:
        d = os.path.dirname(here) if os.path.basename(here) == "bin" else here
    if d == "/" or d in _homes():
        return here
    return d


def _shebang(path: str) -> list[str]:
    """The interpreter argv of a ``#!`` script (empty for anything else)."""
    try:
        with open(path, "rb") as f:
            head = f.read(256)
    except OSError:
        return []
    if not head.startswith(b"#!"):
        return []
    line = head[2:].split(b"\n", 1)[0].decode("utf-8", "replace").strip()
    words = line.split()
    if words and os.path.basename(words[0]) == "env":
        words = [w for w in words[1:] if not w.startswith("-")][:1]
    return words[:1]


def _find(name: str, dirs: Sequence[str]) -> str | None:
    if "/" in name:
        return name if os.path.isfile(name) and os.access(name, os.X_OK) else None
    for d in dirs:
        p = os.path.join(d, name)
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return None


def expose(names: Sequence[str], dirs: Sequence[str], visible: Callable[[str], bool],
           out: Exposure | None = None) -> Exposure:
    """What a sandbox needs to run each of ``names``, searched in ``dirs`` (the sandbox
    paths, then the host PATH); ``visible(path)`` says what the sandbox already shows.
    ``SandboxError`` (one line, naming what is missing) when something is not found."""
    out = out or Exposure()
    for name in names:
        _expose_one(name, dirs, visible, out, depth=0)
    return out


def _expose_one(name: str, dirs: Sequence[str], visible: Callable[[str], bool],
                out: Exposure, depth: int) -> None:
    path = _find(name, dirs)
    if path is None:
        where = ":".join(dirs)
        raise SandboxError(f"cannot run {name!r} in the sandbox: not found in {where} "
                           "(add its directory with --sandbox-path)")
    path = os.path.abspath(path)
    out.found.setdefault(name, path)
    here = os.path.dirname(path)
    real = os.path.realpath(path)
    binds = [b for b in (here, _tree_of(real)) if not visible(b)]
    out.add(binds, [here])
    if depth < 3:
        interp = _shebang(real)
        if interp and Path(interp[0]).name != os.path.basename(real):
            _expose_one(interp[0], dirs, visible, out, depth + 1)
