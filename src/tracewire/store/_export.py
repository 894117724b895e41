"""Exports of a run (JSONL of episodes; Parquet of the index and of branch samples) and
import of a JSONL export back into a run."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np

from .._errors import DecodeError
from ..codec import decode_json, encode_json
from ..trace import Episode
from ._layout import store_error
from ._reader import RunReader
from ._run import Run
from ._status import FsyncPolicy, RunStatus

__all__ = ["export_jsonl", "export_parquet", "import_jsonl", "sample_rows"]


def export_jsonl(run: RunReader, out: IO[bytes], **filters: Any) -> int:
    """Write one JSON line per episode (columns as lists); returns the count."""
    n = 0
    for ep in run.episodes(**filters):
        out.write(encode_json(ep))
        out.write(b"\n")
        n += 1
    return n


def sample_rows(ep: Episode) -> Iterator[dict[str, Any]]:
    """One row per branch (root-to-leaf path) of every trace, with token list columns."""
    for t in ep.traces:
        for b in t.branches():
            yield {
                "episode_id": ep.id,
                "trace_id": t.id,
                "task_key": ep.task_key,
                "group_id": ep.group_id,
                "group_index": ep.group_index,
                "leaf": b.leaf,
                "reward": t.reward,
                "n_tokens": len(b),
                "ids": b.ids,
                "mask": b.mask,
                "logprobs": b.logprobs,
            }


def _samples_table(run: RunReader, filters: dict[str, Any]) -> Any:
    import pyarrow as pa

    rows = [r for ep in run.episodes(**filters) for r in sample_rows(ep)]
    cols: dict[str, Any] = {k: [r[k] for r in rows] for k in
                            ("episode_id", "trace_id", "task_key", "group_id", "group_index",
                             "leaf", "reward", "n_tokens")}  # fmt: skip
    for name, typ in (("ids", pa.int32()), ("mask", pa.uint8()), ("logprobs", pa.float32())):
        arrays = [np.asarray(r[name]) for r in rows]
        offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
        np.cumsum([len(a) for a in arrays], out=offsets[1:])
        flat = np.concatenate(arrays) if arrays else np.empty(0, dtype=typ.to_pandas_dtype())
        cols[name] = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(flat, type=typ))
    return pa.table(cols)


def export_parquet(
    run: RunReader, out: Path, *, samples: bool = False, **filters: Any
) -> list[Path]:
    """Write the index to ``out`` (and with ``samples`` one row per branch to
    ``<out>.samples.parquet``); returns the files written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    df = run.index()
    if filters:
        keep = np.ones(len(df), dtype=bool)
        for k, v in filters.items():
            keep &= (df[k].isin(v) if isinstance(v, list | tuple | set) else df[k] == v).to_numpy()
        df = df[keep]
    written = [out]
    try:
        pq.write_table(pa.Table.from_pandas(df, preserve_index=False), out)
        if samples:
            sp = out.with_name(out.stem + ".samples.parquet")
            pq.write_table(_samples_table(run, filters), sp)
            written.append(sp)
    except OSError as exc:
        raise store_error(f"cannot write {out}", exc) from exc
    return written


def _read_episode(f: IO[bytes], src: Path, lineno: int) -> Episode | None:
    """The next episode line of ``f`` (skipping blank lines), None at the end."""
    while True:
        line = f.readline()
        if not line:
            return None
        if line.strip():
            break
    try:
        ep = decode_json(line)
    except DecodeError as exc:
        raise DecodeError(f"{src}:{lineno}: {exc}") from exc
    if not isinstance(ep, Episode):
        raise DecodeError(f"{src}:{lineno}: a trace, not an episode")
    return ep


async def import_jsonl(src: Path, run_dir: Path, *,
                       fsync: FsyncPolicy | str = FsyncPolicy.INTERVAL) -> int:
    """Append every episode of a JSONL export to the run at ``run_dir`` (created or resumed)."""
    try:
        f = await asyncio.to_thread(open, src, "rb")
    except OSError as exc:
        raise store_error(f"cannot read {src}", exc) from exc
    with f:
        resume = await asyncio.to_thread((run_dir / "meta.json").exists)
        run = await Run.create(run_dir, meta={"imported_from": str(src)}, fsync=fsync,
                               resume=resume)
        n = 0
        status = RunStatus.INTERRUPTED
        try:
            while True:
                # Parsing a big line takes a while; keep it off the loop as well.
                ep = await asyncio.to_thread(_read_episode, f, src, n + 1)
                if ep is None:
                    break
                await run.append(ep)
                n += 1
            status = RunStatus.COMPLETE
        finally:
            await run.close(status)
    return n
