"""Corpus cases of ``evaluate``: bundled environments on the built-in model, through tito,
and the ``command`` environment (the one case with scrubbed values), and their samples."""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import msgspec

from ._runs import Corpus, det, index_rows, run_files
from ._tap import UpstreamTap

__all__ = ["command_records", "eval_records", "eval_samples", "served_records", "tito_records"]

#: (case, environment, seed, tasks, rollouts per task)
EVAL_CASES = [
    ("arithmetic-s0", "arithmetic", 0, 3, 1),
    ("arithmetic-s5", "arithmetic", 5, 2, 2),
    ("guess-s0", "guess", 0, 2, 1),
    ("guess-s3", "guess", 3, 2, 1),
    ("tools-s0", "tools", 0, 3, 1),
    ("tools-s9", "tools", 9, 2, 1),
]


async def eval_records(work: Path, out: Corpus) -> None:
    from tracewire.compose import evaluate
    from tracewire.model import ModelServer

    for case, env, seed, n, r in EVAL_CASES:
        model = ModelServer.run_in_thread(seed=seed)
        try:
            async with UpstreamTap(model.base_url) as tap:
                det.reseed(f"records/{case}")
                result = await evaluate(env, base_url=tap.base_url, n=n, r=r, seed=seed,
                                        concurrency=1, out=work / case)
        finally:
            model.stop()
        out[f"upstream/{case}.reqs"] = tap.frames()
        if result.status != "complete":
            raise RuntimeError(f"{case}: eval ended {result.status} ({result.reason})")
        run_files(f"records/{case}", work / case, out)


#: (case, environment, seed, tasks, tokenizer family, token-in API): the proxy answering
#: token-in/token-out through tito over the built-in model serving that fixture tokenizer.
TITO_CASES = [
    ("tito-tools-qwen25", "tools", 0, 2, "qwen25", "completions"),
    ("tito-guess-llama3", "guess", 1, 1, "llama3", "generate"),
]


#: (case, environment, seed, tasks): ``evaluate(backend="process")``: one env-server worker
#: process runs each rollout (its own proxy) and streams it to this process, which stores
#: the frames as received. The worker gets the same fixed clock and seeded ids through a
#: ``sitecustomize`` on its ``PYTHONPATH`` (label ``<case>/worker``).
SERVED_CASE = ("served-tools-s2", "tools", 2, 2)
_SITE = """\
import importlib.util, os
if os.environ.get("TW_CORPUS_CASE"):
    spec = importlib.util.spec_from_file_location("_tw_corpus_det", {path!r})
    det = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(det)
    det.install()
    det.reseed(os.environ["TW_CORPUS_CASE"] + "/worker")
"""


async def served_records(work: Path, out: Corpus) -> None:
    from tracewire.compose import evaluate
    from tracewire.model import ModelServer

    case, env, seed, n = SERVED_CASE
    boot = work / "boot"
    boot.mkdir()
    (boot / "sitecustomize.py").write_text(_SITE.format(path=det.__file__), "utf-8")
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "TW_CORPUS_CASE")}
    os.environ["PYTHONPATH"] = os.pathsep.join([str(boot), *filter(None, [saved["PYTHONPATH"]])])
    os.environ["TW_CORPUS_CASE"] = f"records/{case}"
    model = ModelServer.run_in_thread(seed=seed)
    try:
        async with UpstreamTap(model.base_url) as tap:
            det.reseed(f"records/{case}")
            result = await evaluate(env, base_url=tap.base_url, n=n, seed=seed, concurrency=1,
                                    backend="process", workers=1, out=work / case)
    finally:
        model.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    if result.status != "complete":
        raise RuntimeError(f"{case}: eval ended {result.status} ({result.reason})")
    run_files(f"records/{case}", work / case, out)
    out[f"upstream/{case}.reqs"] = tap.frames()


#: The ``command`` environment's agent is a subprocess: its pid, the interpreter's path and
#: the random workdir name are recorded in ``trace.info["command"]``. Those three, and the
#: index columns computed from the header bytes (``crc``, ``row_crc``, ``length``,
#: ``offset``), are the only values scrubbed in the corpus; everything else of these
#: records (every other header field, every token buffer) is compared as written.
COMMAND_CASE = ("command-s0", "command", 0, 2)
_SCRUBBED_COLUMNS = ("crc", "row_crc", "length", "offset")


def _scrub(tree: Any, workdir: re.Pattern[str]) -> Any:
    if isinstance(tree, dict):
        out = {k: _scrub(v, workdir) for k, v in tree.items()}
        if isinstance(out.get("command"), dict) and "pid" in out["command"]:
            out["command"] = {**out["command"], "pid": "{pid}"}
        return out
    if isinstance(tree, list):
        return [_scrub(v, workdir) for v in tree]
    if isinstance(tree, str):
        return workdir.sub("{workdir}", tree.replace(sys.executable, "{python}"))
    return tree


async def command_records(work: Path, out: Corpus) -> None:
    from tracewire.compose import evaluate
    from tracewire.model import ModelServer

    from ._compare import split_record, split_segment

    case, env, seed, n = COMMAND_CASE
    model = ModelServer.run_in_thread(seed=seed)
    try:
        det.reseed(f"records/{case}")
        result = await evaluate(env, base_url=model.base_url, n=n, seed=seed, concurrency=1,
                                out=work / case)
    finally:
        model.stop()
    if result.status != "complete":
        raise RuntimeError(f"{case}: eval ended {result.status} ({result.reason})")
    workdir = re.compile(re.escape(tempfile.gettempdir()) + r"/tracewire-cmd-[A-Za-z0-9_]+")
    records = []
    for seg in sorted((work / case / "segments").iterdir()):
        for rec in split_segment(seg.read_bytes()):
            schema, header, bufs = split_record(rec)
            records.append([schema, _scrub(msgspec.msgpack.decode(header), workdir), bufs])
    out[f"records-scrubbed/{case}/records.msgpack"] = msgspec.msgpack.encode(records)
    rows = json.loads(index_rows(work / case))
    for row in rows:
        row.update(dict.fromkeys(_SCRUBBED_COLUMNS, "{scrubbed}"))
    out[f"records-scrubbed/{case}/index.json"] = (
        json.dumps(rows, indent=1, sort_keys=True).encode() + b"\n")


async def tito_records(work: Path, out: Corpus) -> None:
    from tracewire.compose import evaluate
    from tracewire.model import ModelServer
    from tracewire.tito.fixtures import build_tokenizer_dir

    for case, env, seed, n, family, api in TITO_CASES:
        tok = build_tokenizer_dir(work / f"tok-{family}", family)
        model = ModelServer.run_in_thread(seed=seed, tokenizer=tok, non_canonical=0.5)
        try:
            async with UpstreamTap(model.base_url) as tap:
                det.reseed(f"records/{case}")
                result = await evaluate(env, base_url=tap.base_url, n=n, seed=seed,
                                        concurrency=1, out=work / case, tokenizer=str(tok),
                                        upstream_api=api)
        finally:
            model.stop()
        out[f"upstream/{case}.reqs"] = tap.frames()
        if result.status != "complete":
            raise RuntimeError(f"{case}: eval ended {result.status} ({result.reason})")
        run_files(f"records/{case}", work / case, out)


def eval_samples(work: Path, out: Corpus) -> None:
    """Samples of the stored eval episodes (read back from their records)."""
    from tracewire.samples import assemble, encode_samples
    from tracewire.store import open_run

    for case, *_ in EVAL_CASES + TITO_CASES:
        run = open_run(work / case)
        for k, ep in enumerate(run.episodes()):
            for j, trace in enumerate(ep.traces):
                got = assemble(trace, max_seq_len=64, group_id=ep.group_id,
                               group_index=ep.group_index, metadata={"task": ep.task_key})
                out[f"samples/eval/{case}-{k}-{j}.safetensors"] = encode_samples(got)
