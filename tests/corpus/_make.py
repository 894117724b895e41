"""Generate the byte corpus: stored records, env-server wire frames and sample payloads.

``python -m tests.corpus._make --out DIR`` writes the corpus of the code on ``PYTHONPATH``
into ``DIR``; ``--write`` replaces the golden files (``tests/corpus/golden/``, see its
README) and ``--check`` compares against them (what ``test_corpus.py`` does); ``--at
COMMIT`` makes the corpus from that commit's source tree instead (how the golden files were
made). Everything runs in one process on real parts: the built-in model on a loopback port
(its own thread), the interception proxy, the OpenAI and Anthropic SDKs, ``evaluate`` into
real run directories, an env server (stand-in environment, inline worker) spoken to over a
real TCP socket, the session API over HTTP. The only normalisation is ``_determinism``
(fixed clock, seeded ids) and the few values ``_evals`` and ``_sdk`` name.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ._evals import command_records, eval_records, eval_samples, served_records, tito_records
from ._files import GOLDEN, read_dir, write_dir
from ._handmade import handmade_records
from ._http import http_records
from ._runs import Corpus, det
from ._sdk import sdk_records
from ._wire import wire_frames


def _import_everything() -> None:
    # Libraries may draw an id when imported (huggingface_hub does): import them all before
    # the first case, so where the code under test first imports one moves no id.
    import importlib

    for name in ("aiohttp", "anthropic", "openai", "zmq", "zmq.asyncio", "safetensors.numpy",
                 "transformers", "tokenizers", "jinja2", "huggingface_hub", "tracewire",
                 "tracewire.compose", "tracewire.env.bundled", "tracewire.model",
                 "tracewire.proxy", "tracewire.samples", "tracewire.serve",
                 "tracewire.sessions", "tracewire.store", "tracewire.tito",
                 "tracewire.tito.fixtures"):
        importlib.import_module(name)
    det.fix_template_dates()


async def generate() -> Corpus:
    _import_everything()
    out: Corpus = {}
    with tempfile.TemporaryDirectory(prefix="tw-corpus-") as tmp:
        work = Path(tmp)
        await eval_records(work, out)
        await tito_records(work, out)
        await command_records(work, out)
        await served_records(work, out)
        eval_samples(work, out)
        await sdk_records(work, out)
        await wire_frames(work, out)
        await handmade_records(work, out)
        await http_records(work, out)
    return dict(sorted(out.items()))


def at_commit(commit: str) -> Corpus:
    """The corpus of the source tree of ``commit`` (this generator copied into a temporary
    git worktree of it and run there, in a child process)."""
    root = Path(__file__).resolve().parents[2]
    with tempfile.TemporaryDirectory(prefix="tw-corpus-at-") as tmp:
        tree, out = Path(tmp) / "tree", Path(tmp) / "out"
        subprocess.run(["git", "-C", str(root), "worktree", "add", "--detach", str(tree),
                        commit], check=True, capture_output=True)
        try:
            shutil.rmtree(tree / "tests" / "corpus", ignore_errors=True)
            shutil.copytree(Path(__file__).parent, tree / "tests" / "corpus",
                            ignore=shutil.ignore_patterns("golden", "__pycache__"))
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree / "src"), str(tree)])}
            subprocess.run([sys.executable, "-m", "tests.corpus._make", "--out", str(out)],
                           cwd=tree, env=env, check=True)
            return read_dir(out)
        finally:
            subprocess.run(["git", "-C", str(root), "worktree", "remove", "--force",
                            str(tree)], check=False, capture_output=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.corpus._make")
    g = parser.add_mutually_exclusive_group(required=True)
    g.add_argument("--out", type=Path, help="write the corpus into this directory")
    g.add_argument("--write", action="store_true", help="replace the golden files")
    g.add_argument("--check", action="store_true", help="compare with the golden files")
    parser.add_argument("--at", metavar="COMMIT",
                        help="generate from COMMIT's source tree instead of the current one")
    args = parser.parse_args(argv)
    corpus = at_commit(args.at) if args.at else asyncio.run(generate())
    if args.check:
        from ._compare import compare

        problems = compare(read_dir(GOLDEN), corpus)
        print("\n".join(problems) if problems else f"corpus identical ({len(corpus)} files)")
        return 1 if problems else 0
    target = GOLDEN if args.write else args.out
    write_dir(corpus, target)
    print(f"wrote {len(corpus)} files ({sum(map(len, corpus.values()))} bytes) to {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
