"""Bench token-in/token-out prompt construction and completion parsing.

    .venv/bin/python bench/tito.py

Over fixture tokenizers (a tiny byte-level BPE + a Qwen2.5-like and a Llama 3-like chat
template, built on the spot, loaded through the same offline path users run), one session
of 1,000 tool-calling turns (an assistant call, 1-2 tool results, a user message every 5th
turn):

- ``one_session_<fam>``: ``turn_10_ms`` / ``turn_1000_ms``: prompt construction for one turn
  (bridge: junction + suffix render + encode, appended to the branch's recorded ids), the
  median of the 10 turns around turn 10 and turn 1,000 (target: turn 1,000 <= 2x turn 10);
  ``plan_turn_10_ms`` / ``plan_turn_1000_ms`` also resolve the request's whole message list
  against the recorded turns (O(messages) hashing; inside the proxy its message graph does
  that matching already).
- ``ctx_turn_10_ms`` / ``ctx_turn_1000_ms``: the path behind the proxy
  (``TokenSession.plan_on``): the pipeline's numpy copy of the matched branch's ids,
  checked against the session's kept tip (``BranchTip``, a memcmp) instead of converted to
  Python ints, then the bridge; no history resolve (the proxy's message graph matched it).
- ``turns_128_<fam>``: ``prompt_ms`` at turn 128, ours (bridge) vs the baseline our anchors
  use: re-render the whole conversation with the chat template and tokenize it, every turn
  (target ratio >= 20x).
- ``parse_<fam>``: ``parse_us`` for one completion (reasoning-free text + one tool call).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, median_ms

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tracewire.tito import (
    BranchTip,
    ChatTokenizer,
    Plan,
    PromptBuilder,
    TokenSession,
    parse_completion,
)
from tracewire.tito.fixtures import build_tokenizer_dir

TURNS = 1000
RUNS = 5
TOOLS = [{"type": "function", "function": {
    "name": "lookup", "description": "Look a key up.",
    "parameters": {"type": "object", "properties": {"i": {"type": "integer"}}}}}]


def completion(fam: str, t: int) -> str:
    args = f'{{"i": {t}}}'
    if fam == "llama3":
        return f'{{"name": "lookup", "parameters": {args}}}'
    return f'Checking item {t} now.\n<tool_call>\n{{"name": "lookup", "arguments": {args}}}\n' \
           f'</tool_call>'


def session(fam: str, b: PromptBuilder) -> tuple[list[float], list[float], list[float],
                                                 dict[int, list[dict[str, Any]]]]:
    """Run TURNS turns; per turn (bridge ms, plan ms, proxy-path ms), and the history at a
    few turns."""
    s = TokenSession(b)
    s_ctx = TokenSession(b)
    ctx_ms: list[float] = []
    branch: np.ndarray[Any, Any] | None = None
    after_assistant = 0
    tip = BranchTip()
    ctx_plan: tuple[Plan, Any] | None = None
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "You look things up."},
                                  {"role": "user", "content": "Look up items 0 to 999."}]
    bridge_ms, plan_ms = [], []
    saved: dict[int, list[dict[str, Any]]] = {}
    for t in range(TURNS):
        if t + 1 in (128,):
            saved[t + 1] = list(msgs)
        if t == 0:
            plan = s.plan(msgs, TOOLS)
        else:
            # TokenSession.plan, step by step, to time the resolve and the construction.
            t0 = time.perf_counter()
            cont = s.index.resolve(msgs)
            t1 = time.perf_counter()
            assert cont.kind == "bridge" and cont.turn is not None, (t, cont.reason)
            r = b.bridge(cont.turn.last_id, cont.turn.length, cont.new, TOOLS)
            plan = Plan(cont, cont.turn, r, msgs)
            plan.point = cont.turn.extended(r.ids)
            t2 = time.perf_counter()
            bridge_ms.append((t2 - t1) * 1e3)
            plan_ms.append((t2 - t0) * 1e3)
            # Behind the proxy: the turn pipeline hands the matched branch's ids (a numpy
            # copy of the trace's slice) and the count of new messages; no resolve here.
            assert branch is not None
            t3 = time.perf_counter()
            base = branch.copy()
            p = s_ctx.plan_on(msgs, TOOLS, new=len(msgs) - after_assistant,
                              base_ids=tip.take(base), base_sampled=True)
            t4 = time.perf_counter()
            ctx_ms.append((t4 - t3) * 1e3)
            assert p.prompt_ids == plan.prompt_ids  # the same prompt either way
            ctx_plan = (p, base)
        ids = [*b.tok.encode(completion(fam, t)), b.family.stop_ids[0]]
        a = parse_completion(b.tok.decode(ids), b.family).as_message()
        s.commit(plan, a, ids, ended_by_stop=True)
        msgs.append(a)
        after_assistant = len(msgs)
        if ctx_plan is not None:  # what TokenUpstream does when the turn commits
            tip.keep(ctx_plan[0], ctx_plan[1], ids)
        branch = np.asarray(plan.point.ids() + ids, dtype=np.int32)
        msgs += [{"role": "tool", "tool_call_id": a["tool_calls"][0]["id"],
                  "content": f"item {t}: value {t * 7 % 13}"} for _ in range(1 + t % 2)]
        if t % 5 == 4:
            msgs.append({"role": "user", "content": f"Good. Continue after {t}."})
    assert not s.rerenders, s.rerenders
    bridge_ms.insert(0, bridge_ms[0])  # index = turn number - 1 (turn 1 is a full render)
    plan_ms.insert(0, plan_ms[0])
    ctx_ms.insert(0, ctx_ms[0])
    return bridge_ms, plan_ms, ctx_ms, saved


def window(xs: list[float], turn: int) -> float:
    lo = max(1, turn - 5)
    return statistics.median(xs[lo:turn + 5][:10])


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="tw-bench-tito-"))
    for fam in ("qwen25", "llama3"):
        b = PromptBuilder(ChatTokenizer(build_tokenizer_dir(root / fam, fam)))
        bridge_ms, plan_ms, ctx_ms, saved = session(fam, b)
        emit("tito", f"one_session_{fam}", "turn_10_ms", "ms", window(bridge_ms, 10), None,
             "lower", 10)
        emit("tito", f"one_session_{fam}", "turn_1000_ms", "ms",
             window(bridge_ms, TURNS - 6), None, "lower", 10)
        emit("tito", f"one_session_{fam}", "plan_turn_10_ms", "ms", window(plan_ms, 10), None,
             "lower", 10)
        emit("tito", f"one_session_{fam}", "plan_turn_1000_ms", "ms",
             window(plan_ms, TURNS - 6), None, "lower", 10)
        emit("tito", f"one_session_{fam}", "ctx_turn_10_ms", "ms", window(ctx_ms, 10), None,
             "lower", 10)
        emit("tito", f"one_session_{fam}", "ctx_turn_1000_ms", "ms",
             window(ctx_ms, TURNS - 6), None, "lower", 10)
        hist = saved[128]
        tok = b.tok

        def baseline(hist: list[dict[str, Any]] = hist, tok: ChatTokenizer = tok) -> None:
            # What a re-rendering trainer does each turn: template + tokenize everything.
            tok.hf.apply_chat_template(hist, tools=TOOLS, tokenize=True,
                                       add_generation_prompt=True, return_dict=False)

        base = median_ms(baseline, RUNS)
        emit("tito", f"turns_128_{fam}", "prompt_ms", "ms", window(bridge_ms, 128), base,
             "lower", RUNS)
        text = tok.decode([*tok.encode(completion(fam, 42)), b.family.stop_ids[0]])
        per = median_ms(lambda text=text, b=b: [parse_completion(text, b.family)
                                                for _ in range(1000)], RUNS)
        emit("tito", f"parse_{fam}", "parse_us", "us", per, None, "lower", RUNS)


if __name__ == "__main__":
    main()
