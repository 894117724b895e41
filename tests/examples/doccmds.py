"""The commands the docs show, parsed out of them, and a fresh clone to run them in.

A fenced block is marked by an HTML comment on the line before it (invisible on GitHub):

    <!-- docs-test: KIND [slow] [setup] [needs=a,b] [expect=REGEX [each]] [hints] -->

KIND is ``run`` (every line is a shell command, run as one bash script in the clone's
root), ``serve`` (a command that serves until stopped: it must print a URL that answers
200), ``python`` (the doc's python blocks run in order as one script, top-level ``await``
allowed), ``file=PATH`` (the block is a verbatim excerpt of that file), ``template``
(placeholders a user fills in: not run) or ``skip`` (runs elsewhere, e.g. ``make test``).
``setup`` blocks run before every later block of the doc (``source .venv/bin/activate``);
``needs`` names executables the block needs; ``expect`` is a regex the output must
contain (``each``: once per command of the block); ``hints`` runs the ``tracewire ...``
commands the block printed. Every bash/sh/python/unlabelled block must carry a marker, so a
command cannot be added to the docs without being run by the tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ("README.md", "docs/RUNTIMES.md")
KINDS = ("run", "serve", "python", "template", "skip")
#: Languages whose blocks must be marked (``text`` blocks show output and need none).
CODE_LANGS = ("", "bash", "sh", "shell", "console", "python", "py")

_MARK = re.compile(r"^\s*<!--\s*docs-test:\s*(.*?)\s*-->\s*$")
_FENCE = re.compile(r"^(\s*)```(\S*)")


@dataclass
class Block:
    """One fenced block of a doc and what its marker says to do with it."""

    doc: str
    line: int
    lang: str
    text: str
    kind: str = ""
    file: str = ""
    slow: bool = False
    setup: bool = False
    hints: bool = False
    each: bool = False
    needs: list[str] = field(default_factory=list)
    expect: str = ""

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"

    @property
    def commands(self) -> list[str]:
        """The block's command lines (comments and blank lines left out)."""
        return [ln for ln in self.text.splitlines() if ln.strip() and
                not ln.lstrip().startswith("#")]


def _apply(block: Block, marker: str) -> None:
    for word in shlex.split(marker):
        key, _, value = word.partition("=")
        if key in KINDS and not value:
            block.kind = key
        elif key == "file":
            block.kind, block.file = "file", value
        elif key in ("slow", "setup", "hints", "each"):
            setattr(block, key, True)
        elif key == "needs":
            block.needs = [v for v in value.split(",") if v]
        elif key == "expect":
            block.expect = value
        else:
            raise ValueError(f"{block.where}: unknown docs-test word {word!r}")


def blocks(doc: str, root: Path = ROOT) -> list[Block]:
    """The fenced blocks of ``doc`` (a path relative to ``root``), in order."""
    lines = (root / doc).read_text("utf-8").splitlines()
    out: list[Block] = []
    marker: str | None = None
    i = 0
    while i < len(lines):
        m = _MARK.match(lines[i])
        if m:
            marker = m.group(1)
            i += 1
            continue
        f = _FENCE.match(lines[i])
        if not f:
            if lines[i].strip():
                marker = None  # a marker applies to the block right after it
            i += 1
            continue
        indent, lang = f.group(1), f.group(2)
        body: list[str] = []
        start = i + 1
        i += 1
        while i < len(lines) and not lines[i].strip().startswith("```"):
            line = lines[i]
            body.append(line[len(indent):] if line.startswith(indent) else line.lstrip())
            i += 1
        i += 1
        b = Block(doc, start, lang, "\n".join(body) + "\n")
        if marker is not None:
            _apply(b, marker)
        out.append(b)
        marker = None
    return out


def missing(needs: list[str]) -> list[str]:
    """The executables of ``needs`` that are not installed (``bwrap`` must also work)."""
    gone = []
    for exe in needs:
        if exe == "bwrap":
            from tracewire.runtime import bwrap_usable

            why = asyncio.run(bwrap_usable())
            if why is not None:
                gone.append(f"a usable bwrap ({why})")
        elif exe == "mini":
            if not (Path(sys.prefix) / "bin" / "mini").exists() and not shutil.which("mini"):
                gone.append(exe)
        elif shutil.which(exe) is None:
            gone.append(exe)
    return gone


# -- a fresh clone -------------------------------------------------------------------------


def fresh_clone(dest: Path) -> Path:
    """Clone the repository into ``dest``: what is committed plus the tracked files'
    uncommitted changes (``git stash create``; untracked files are not part of a clone),
    with a ``.venv`` that is this interpreter's environment (its entries linked, its
    install stamp newer than the clone's ``pyproject.toml``, so ``make`` does not reinstall).
    """
    snap = subprocess.run(["git", "stash", "create"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout.strip()
    subprocess.run(["git", "clone", "-q", str(ROOT), str(dest)], check=True)
    if snap:
        subprocess.run(["git", "checkout", "-q", snap], cwd=dest, check=True)
    venv = Path(sys.prefix)
    assert venv != Path(sys.base_prefix), "the docs tests run from the project's venv"
    shim = dest / ".venv"
    shim.mkdir()
    for entry in venv.iterdir():
        if entry.name != ".installed-stamp":
            (shim / entry.name).symlink_to(entry)
    (shim / ".installed-stamp").touch()
    return dest


def user_env(clone: Path) -> dict[str, str]:
    """A new user's shell in the clone: no venv active or on PATH; the clone's sources."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHONHOME", "PYTEST_CURRENT_TEST")}
    venv_bins = {str(Path(sys.prefix) / "bin"), str(Path(sys.prefix).resolve() / "bin")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if p and p not in venv_bins)
    env["PYTHONPATH"] = str(clone / "src")  # the clone's code, not the venv's editable one
    env["NO_COLOR"] = "1"
    env["COLUMNS"] = "100"
    return env


@dataclass
class Ran:
    """What one block printed and its exit status."""

    code: int
    out: str


def run_shell(script: str, clone: Path, timeout: float) -> Ran:
    """``script`` in bash (``set -eo pipefail``: each command must succeed) in ``clone``."""
    res = subprocess.run(["bash", "-c", "set -eo pipefail\n" + script], cwd=clone,
                         env=user_env(clone), capture_output=True, text=True,
                         timeout=timeout, check=False)
    return Ran(res.returncode, res.stdout + res.stderr)


def run_python(source: str, clone: Path, name: str, timeout: float) -> Ran:
    """``source`` (top-level ``await`` allowed) with the clone's ``.venv/bin/python``."""
    script = clone / ".docs-test.py"
    script.write_text(source, "utf-8")
    runner = ("import ast, asyncio, sys\n"
              "src = open(sys.argv[1], encoding='utf-8').read()\n"
              f"code = compile(src, {name!r}, 'exec', flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)\n"
              "ns = {'__name__': '__main__'}\n"
              "res = eval(code, ns)\n"
              "if asyncio.iscoroutine(res):\n"
              "    asyncio.run(res)\n")
    res = subprocess.run([str(clone / ".venv" / "bin" / "python"), "-c", runner, str(script)],
                         cwd=clone, env=user_env(clone), capture_output=True, text=True,
                         timeout=timeout, check=False)
    return Ran(res.returncode, res.stdout + res.stderr)


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def run_serve(command: str, setup: str, clone: Path, timeout: float) -> Ran:
    """Start ``command``, wait for the URL it prints, GET it (200 expected), stop it. The
    viewer's default port may be taken on a shared machine: then ``--port 0`` is added."""
    if "tracewire view" in command and "--port" not in command and not _port_free(8765):
        command += " --port 0"
    proc = subprocess.Popen(["bash", "-c", f"set -eo pipefail\n{setup}exec {command}"],
                            cwd=clone, env=user_env(clone), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    out: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + timeout
        url = None
        while url is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            out.append(line)
            m = re.search(r"https?://[^\s]+", line)
            if m:
                url = m.group(0).rstrip(".,)")
        if url is None:
            return Ran(proc.poll() or 1, "".join(out) + "\n(no URL printed)")
        with urllib.request.urlopen(url, timeout=30) as r:  # loopback: the viewer
            status = r.status
        return Ran(0 if status == 200 else status, "".join(out) + f"\nGET {url}: {status}")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


#: The commands ``make demo`` tells the user to run next.
HINT = re.compile(r"^(?:Open the viewer|Export the run):\s+(\S.*?)\s*$", re.M)
