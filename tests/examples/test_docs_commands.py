"""Every command of the README and of docs/RUNTIMES.md runs as written, on a fresh clone in
a temporary directory, with the project's existing venv reached the documented way
(``source .venv/bin/activate`` or ``.venv/bin/...``); the commands are parsed out of the
docs (see ``doccmds``), so the docs and this test cannot drift apart. Slow blocks (an RL
run, the agent CLIs) are separate tests marked ``slow``; a block needing an agent CLI
that is not installed skips, naming it, and fails where ``TRACEWIRE_REQUIRE_AGENTS=1``."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from . import doccmds
from .doccmds import DOCS, ROOT, Block, Ran

TIMEOUT = 300
SLOW_TIMEOUT = 900


def _all() -> list[Block]:
    return [b for doc in DOCS for b in doccmds.blocks(doc)]


def _fail(b: Block, ran: Ran, what: str = "") -> None:
    tail = ran.out[-4000:]
    pytest.fail(f"{b.where}: {what or 'the documented command did not run'} "
                f"(exit {ran.code}):\n{b.text}\n--- output ---\n{tail}")


def _check(b: Block, ran: Ran) -> None:
    if ran.code != 0:
        _fail(b, ran)
    if b.expect:
        want = len(b.commands) if b.each else 1
        got = len(re.findall(b.expect, ran.out))
        if got < want:
            _fail(b, ran, f"output shows {got} of the {want} {b.expect!r} the doc promises")


def _needs(b: Block) -> None:
    gone = doccmds.missing(b.needs)
    if gone:
        if os.environ.get("TRACEWIRE_REQUIRE_AGENTS") == "1":
            pytest.fail(f"{b.where} needs {', '.join(gone)}, which is not installed "
                        "(TRACEWIRE_REQUIRE_AGENTS=1: CI installs the agent CLIs)")
        pytest.skip(f"{b.where} needs {', '.join(gone)} (not installed)")


@pytest.mark.parametrize("doc", DOCS)
def test_every_code_block_is_marked(doc: str) -> None:
    # A command added to a doc without a docs-test marker would go untested.
    found = doccmds.blocks(doc)
    assert found, doc
    for b in found:
        if b.lang in doccmds.CODE_LANGS:
            assert b.kind, f"{b.where}: a ```{b.lang} block without a docs-test marker"
        if b.kind == "file":
            text = (ROOT / b.file).read_text("utf-8")
            assert b.text.strip() in text, f"{b.where}: not an excerpt of {b.file} any more"
        if b.kind == "serve":
            assert len(b.text.strip().splitlines()) == 1, f"{b.where}: one command per serve"


def _setup(found: list[Block], upto: Block) -> str:
    return "".join(b.text for b in found if b.setup and b.line < upto.line)


def _run_block(b: Block, found: list[Block], clone: Path, timeout: float) -> None:
    setup = _setup(found, b)
    if b.kind == "run":
        ran = doccmds.run_shell(setup + b.text, clone, timeout)
        _check(b, ran)
        if b.hints:
            hints = doccmds.HINT.findall(ran.out)
            assert len(hints) == 2, f"{b.where}: expected a view and an export hint:\n{ran.out}"
            for cmd in hints:
                if " view " in f" {cmd} ":
                    hran = doccmds.run_serve(cmd, "", clone, timeout)
                else:
                    hran = doccmds.run_shell(cmd, clone, timeout)
                if hran.code != 0:
                    _fail(b, hran, f"the printed hint {cmd!r} does not run as printed")
    elif b.kind == "serve":
        _check(b, doccmds.run_serve(b.text.strip(), setup, clone, timeout))


@pytest.mark.parametrize("doc", DOCS)
def test_doc_commands_run_on_a_fresh_clone(doc: str, tmp_path: Path) -> None:
    found = doccmds.blocks(doc)
    clone = doccmds.fresh_clone(tmp_path / "clone")
    ran_any = False
    for b in found:
        if b.kind in ("run", "serve") and not b.slow:
            _needs(b)
            _run_block(b, found, clone, TIMEOUT)
            ran_any = True
    py = [b for b in found if b.kind == "python" and not b.slow]
    for b in py:
        _needs(b)
    if py:
        source = "".join(b.text for b in py)
        ran = doccmds.run_python(source, clone, doc, TIMEOUT)
        if ran.code != 0:
            _fail(py[0], ran, "the doc's python blocks did not run (in order, as one script)")
        ran_any = True
    assert ran_any, f"{doc}: nothing to run"


def _slow() -> list[object]:
    return [pytest.param(b, id=b.where) for b in _all()
            if b.slow and b.kind in ("run", "serve", "python")]


@pytest.fixture(scope="module")
def slow_clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return doccmds.fresh_clone(tmp_path_factory.mktemp("docs") / "clone")


@pytest.mark.slow
@pytest.mark.parametrize("block", _slow())
def test_slow_doc_command(block: Block, slow_clone: Path) -> None:
    _needs(block)
    found = doccmds.blocks(block.doc)
    if block.kind == "python":
        ran = doccmds.run_python(block.text, slow_clone, block.where, SLOW_TIMEOUT)
        _check(block, ran)
    else:
        _run_block(block, found, slow_clone, SLOW_TIMEOUT)
