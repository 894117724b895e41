"""Bench the token-in/token-out mismatch report and the GGUF tokenizer load.

    .venv/bin/python bench/tito_report.py [--runs 3] [--gguf FILE.gguf]

Over the qwen25 fixture tokenizer, one conversation grown to 2k, 20k and 200k recorded ids,
every third answer sampled one token per character (non-canonical: hundreds of retokenized
stretches for the report to find):

- ``report_<n>``: ``report_ms``, ``mismatch_report`` of the branch, ours vs the previous
  implementation (``difflib.SequenceMatcher`` over the whole branch, kept here as the
  baseline; not run at 200k, where it takes tens of minutes). Both must find the same kinds
  and the same mismatch (checked; printed as ``#`` lines with both counts).
- ``report_<n>``: ``loop_gap_ms``, the longest an asyncio loop waited for a 1 ms sleep while
  the report ran in a worker thread (``idle`` gives the machine's own noise).
- ``gguf_load`` (with ``--gguf``): ``build_ms`` (read the metadata with ``gguf`` and build the
  tokenizer, cache bypassed), ``cached_ms`` (the cached form), ``chat_tokenizer_ms`` (the
  whole ``ChatTokenizer`` in a fresh process, cache warm: transformers import included).
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, median_ms

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tracewire.tito import (
    ChatTokenizer,
    PromptBuilder,
    TokenSession,
    chat_messages,
    mismatch_report,
    parse_completion,
)
from tracewire.tito.fixtures import build_tokenizer_dir

ANSWER = "The answer to {t} plus {t} is {s}; Paris is sunny at 21 degrees, Berlin rains. "


def branch(b: PromptBuilder, tokens: int) -> tuple[list[int], list[bool], list[dict[str, Any]]]:
    """A conversation recorded through TokenSession until it holds ``tokens`` ids."""
    tok = b.tok
    s = TokenSession(b)
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "Be long."}]
    ids: list[int] = []
    mask: list[bool] = []
    t = 0
    while len(ids) < tokens:
        msgs.append({"role": "user", "content": f"question {t}, please"})
        plan = s.plan(msgs)
        text = ANSWER.format(t=t, s=2 * t) * 4
        comp = tok.encode(text) if t % 3 else [i for ch in text for i in tok.encode(ch)]
        comp = [*comp, b.family.stop_ids[0]]
        a = parse_completion(tok.decode(comp), b.family).as_message()
        s.commit(plan, a, comp, ended_by_stop=True)
        prompt = plan.prompt_ids
        mask = mask + [False] * (len(prompt) - len(ids)) + [True] * len(comp)
        ids = prompt + comp
        msgs.append(a)
        t += 1
    return ids, mask, msgs


def difflib_counts(b: PromptBuilder, recorded: Sequence[int], sampled: Sequence[bool],
                   messages: Sequence[dict[str, Any]]) -> Counter[str]:
    """The previous report: one SequenceMatcher over the whole branch (quadratic)."""
    tok = b.tok
    canon = tok.encode(tok.render(chat_messages(messages)))
    junction = tok.encode(b.family.junction) if b.family.junction else []
    if junction and sampled[-1] and canon[-len(junction):] == junction \
            and list(recorded[-len(junction):]) != junction:
        canon = canon[:-len(junction)]
    special = {v: k for k, v in tok.special.items()}
    out: Counter[str] = Counter()
    sm = difflib.SequenceMatcher(a=list(recorded), b=canon, autojunk=False)
    for op, r0, r1, c0, c1 in sm.get_opcodes():
        if op == "equal":
            continue
        rs = Counter(special[i] for i in recorded[r0:r1] if i in special)
        cs = Counter(special[i] for i in canon[c0:c1] if i in special)
        in_sampled = any(sampled[r0:r1]) if r1 > r0 else (
            (r0 > 0 and sampled[r0 - 1]) or (r0 < len(sampled) and sampled[r0]))
        if rs != cs:
            out["special"] += 1
        elif tok.decode(recorded[r0:r1]) == tok.decode(canon[c0:c1]):
            out["retokenized"] += 1
        else:
            out["assistant_text" if in_sampled else "prompt_text"] += 1
    return out


def loop_gap_ms(fn: Callable[[], Any]) -> float:
    """The longest a 1 ms asyncio sleep took while ``fn`` ran in a worker thread."""
    async def run() -> float:
        task = asyncio.create_task(asyncio.to_thread(fn))
        worst = 0.0
        while not task.done():
            t0 = time.perf_counter()
            await asyncio.sleep(0.001)
            worst = max(worst, time.perf_counter() - t0)
        await task
        return worst * 1e3
    return asyncio.run(run())


def bench_report(runs: int) -> None:
    root = Path(tempfile.mkdtemp(prefix="tw-bench-report-"))
    b = PromptBuilder(ChatTokenizer(build_tokenizer_dir(root / "qwen25", "qwen25")))
    emit("tito_report", "idle", "loop_gap_ms", "ms",
         statistics.median(loop_gap_ms(lambda: time.sleep(0.3)) for _ in range(runs)), None,
         "lower", runs)
    for n in (2_000, 20_000, 200_000):
        ids, mask, msgs = branch(b, n)
        ours = mismatch_report(b, ids, mask, msgs)

        def new(ids: list[int] = ids, mask: list[bool] = mask,
                msgs: list[dict[str, Any]] = msgs) -> None:
            mismatch_report(b, ids, mask, msgs)

        base = None
        if n <= 20_000:
            ref = difflib_counts(b, ids, mask, msgs)
            # Same findings; stretch counts can differ (a long retokenized answer with only
            # 1-3 ids in a row shared inside counts once here, per word in difflib).
            assert set(ref) == set(ours.by_kind) and ours.mismatch == sum(
                ref[k] for k in ("special", "prompt_text")), (ref, ours.by_kind)
            print(f"# {n}: difflib {dict(ref)} ours {dict(ours.by_kind)}", flush=True)
            base = median_ms(lambda ids=ids, mask=mask, msgs=msgs: difflib_counts(
                b, ids, mask, msgs), 1)
        t = median_ms(new, runs)
        emit("tito_report", f"report_{n // 1000}k", "report_ms", "ms", t, base, "lower", runs)
        gap = statistics.median(loop_gap_ms(new) for _ in range(runs))
        emit("tito_report", f"report_{n // 1000}k", "loop_gap_ms", "ms", gap, None, "lower",
             runs)


def bench_gguf(path: str, runs: int) -> None:
    from tracewire.tokens import _gguf, load_gguf

    build = median_ms(lambda: load_gguf(path, use_cache=False), runs,
                      setup=_gguf._memo.clear)
    emit("tito_report", "gguf_load", "build_ms", "ms", build, None, "lower", runs)
    load_gguf(path)  # fill the disk cache

    def cached() -> None:
        _gguf._memo.clear()
        load_gguf(path).tokenizer()

    emit("tito_report", "gguf_load", "cached_ms", "ms", median_ms(cached, runs), None,
         "lower", runs)
    code = ("import time; t=time.perf_counter(); from tracewire.tito import ChatTokenizer; "
            f"ChatTokenizer({path!r}); print(time.perf_counter()-t)")
    times = [float(subprocess.run([sys.executable, "-c", code], capture_output=True,
                                  text=True, check=True).stdout.split()[-1]) * 1e3
             for _ in range(runs)]
    emit("tito_report", "gguf_load", "chat_tokenizer_ms", "ms", statistics.median(times),
         None, "lower", runs)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--gguf", default=None, help="a GGUF model file to time loading")
    args = p.parse_args()
    bench_report(args.runs)
    if args.gguf:
        bench_gguf(args.gguf, args.runs)


if __name__ == "__main__":
    main()
