"""Side by side on a real model: how often do a model's own replies come back as other ids?

    .venv/bin/python bench/engine_retokenize.py [--scale 1]

SmolLM2-135M-Instruct on llama.cpp's server (one thread), the bundled text environments
and an openai SDK multi-turn loop (streamed and not), the same tasks and seeds both ways:

- ours: ``evaluate(env, engine="llamacpp")``, token-in/token-out. A recording relay between
  the proxy and the server keeps the wire; a turn counts when the ids the trace holds for
  the model's reply are not the ids the server sampled (the real-engine tests assert 0).
- baseline: the chat pass-through on the server's own ``/v1/chat/completions``, which
  renders the history and re-tokenizes it every turn. A turn counts when ``/tokenize`` of
  the reply's text gives other ids than the ones sampled (the relay asks for the ids with
  ``logprobs``), i.e. the server's next prompt holds ids the model never produced.

Both sides sample untruncated (top_k/top_p/min_p neutral) at ``--temperature`` (default
1.0; the SDK loop sets its own 1.0) with the environments' other settings.
Tool-call replies (re-serialized by the server) are not counted on either side.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the lane's relay and parser
from tests.realmodel.relay import read_log, wrapper_script
from tests.realmodel.sidebyside import Tally, chat_side, differing_tokens
from tests.realmodel.wire import answer_calls, check_against_wire, completion_turns

from _common import emit
from tracewire.compose import evaluate
from tracewire.engine import LlamaServer, find_llama_server

ROOT = Path(__file__).resolve().parents[1]
REAL = find_llama_server()
SDK_LOOP = str(ROOT / "tests" / "realmodel" / "sdk_loop_env.py")
#: (case, environment, tasks at scale 1)
CASES = [("arithmetic", "arithmetic", 20), ("guess", "guess", 6), ("tools", "tools", 6),
         ("command", "command", 20), ("sdk_loop", SDK_LOOP, None)]


async def _ours(env: str, n: int | None, tmp: Path, seed: int, temperature: float
                ) -> tuple[int, int, int, int]:
    """(turns, turns whose recorded ids differ from the sampled ones, tokens, differing)."""
    log = tmp / "wire.jsonl"
    os.environ["TRACEWIRE_LLAMA_SERVER"] = str(wrapper_script(tmp, REAL, log))
    try:
        result = await evaluate(env, engine="llamacpp", n=n, concurrency=1, out=tmp / "run",
                                seed=seed, temperature=temperature)
    finally:
        del os.environ["TRACEWIRE_LLAMA_SERVER"]
    turns = completion_turns(read_log(log))
    turns_n = differ = tokens = tokens_differ = refused = 0
    at = 0
    for ep in result.run.episodes():
        for trace in ep.traces:
            # The lane's check (it raises on any difference); then the per-turn tally.
            got = check_against_wire(trace, turns, at)
            mine = [t for t in turns[at:got.at] if not t.refused]
            refused += len(got.errors)
            at = got.at
            for k, turn in zip(answer_calls(trace), mine, strict=True):
                node = trace.nodes[trace.calls[k].node or 0]
                if node.message.tool_calls:  # not a tokenization question here either
                    continue
                got_ids = trace.columns.ids[node.start:node.end].tolist()
                turns_n += 1
                tokens += len(turn.ids)
                if got_ids != turn.ids:
                    differ += 1
                    tokens_differ += differing_tokens(got_ids, turn.ids)
    if refused:
        print(f"  {refused} streamed answers refused (ids withheld by the server)",
              file=sys.stderr)
    return turns_n, differ, tokens, tokens_differ


async def main(scale: float, temperature: float) -> None:
    total_ours = [0, 0, 0, 0]
    total = Tally()
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        async with LlamaServer(threads=1, parallel=1) as server:
            for case, env, n in CASES:
                tasks = None if n is None else max(1, round(n * scale))
                chat = await chat_side(env, tasks, server.url, tmp / f"chat-{case}", seed=7,
                                       temperature=temperature)
                (tmp / case).mkdir()
                ours = await _ours(env, tasks, tmp / case, seed=7, temperature=temperature)
                total.add(chat)
                total_ours = [a + b for a, b in zip(total_ours, ours, strict=True)]
                _report(case, ours, chat)
                for text, sampled, again in chat.examples[:2]:
                    print(f"  {case}: {text[:60]!r}: sampled {len(sampled)} ids, re-tokenized"
                          f" {len(again)}", file=sys.stderr)
    _report("all", (total_ours[0], total_ours[1], total_ours[2], total_ours[3]), total)


def _report(case: str, ours: tuple[int, int, int, int], chat: Tally) -> None:
    emit("engine_retokenize", case, "turns_with_other_ids", "turns", ours[1], chat.differ,
         "lower", chat.turns)
    emit("engine_retokenize", case, "tokens_with_other_ids", "tokens", ours[3],
         chat.tokens_differ, "lower", chat.tokens)
    print(f"{case}: token-in/token-out {ours[1]} of {ours[0]} turns ({ours[3]} of {ours[2]} "
          f"tokens) recorded other ids than sampled; chat endpoint {chat.differ} of "
          f"{chat.turns} turns ({chat.tokens_differ} of {chat.tokens} tokens) re-tokenize to "
          f"other ids ({chat.text_changed} with the text itself changed, "
          f"{chat.tool_call_turns} tool-call turns not counted)", file=sys.stderr)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=float, default=1.0, help="tasks per env x this")
    ap.add_argument("--temperature", type=float, default=1.0,
                    help="sampling temperature on both sides (default: 1.0)")
    args = ap.parse_args()
    asyncio.run(main(args.scale, args.temperature))
