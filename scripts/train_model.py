"""Build the bundled task data and train the built-in demo model (deterministic).

    .venv/bin/python scripts/train_model.py            # write data + assets, then evaluate
    .venv/bin/python scripts/train_model.py --eval-only

Writes ``src/tracewire/env/bundled/data/{arithmetic,tools,guess,command}.jsonl`` and
``src/tracewire/model/assets/{tokenizer.json,model.npz}``, then plays every environment
in-process at temperature 1 and 0 and prints the success rates.
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import model_data as md

from tracewire.model._engine import Engine, Generation, SamplingParams
from tracewire.model._template import ChatTemplate
from tracewire.model._tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "src/tracewire/env/bundled/data"
ASSETS = ROOT / "src/tracewire/model/assets"
SEED = 20240611
N_PIECES = 1500
GAMMA = 0.08
FLOOR = 1e-4
_CHUNK = re.compile(r" ?[A-Za-z]+| ?[0-9]|[^A-Za-z0-9\s]{1,3}| ?[^A-Za-z0-9\s]{1,2}|\n+| +")


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def call_msg(call: dict[str, Any], i: int) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [{
        "id": f"call_{i}", "type": "function",
        "function": {"name": call["name"], "arguments": json.dumps(call["arguments"])}}]}


def transcripts(rng: random.Random, data: dict[str, list[dict[str, Any]]]) -> list[Any]:
    """(messages, tools) of every training conversation; 1 or 2 of 3 per task are right."""
    out: list[Any] = []
    for row in data["arithmetic"]:
        good = rng.choice([1, 2])
        for j in range(3):
            c = int(row["answer"])
            result = c if j < good else c + rng.choice([-10, -2, -1, 1, 2, 10])
            out.append(([{"role": "system", "content": row["system"]},
                         {"role": "user", "content": row["question"]},
                         {"role": "assistant", "content": md.arithmetic_reply(row, result)}],
                        None))
    for i, row in enumerate(data["tools"]):
        good = rng.choice([1, 2])
        for j in range(3):
            call = row["expected_call"] if j < good else md.corrupt_call(rng, row["expected_call"])
            result = md.run_tool(call["name"], json.dumps(call["arguments"]))
            out.append(([{"role": "system", "content": row["system"]},
                         {"role": "user", "content": row["question"]},
                         call_msg(call, i),
                         {"role": "tool", "tool_call_id": f"call_{i}", "content": result},
                         {"role": "assistant", "content": md.tool_final(row, call, result)}],
                        md.TOOLS))
    for row in data["guess"]:
        for _ in range(3):
            out.append((md.guess_game(rng, row), None))
    for row in data["command"]:
        good = rng.choice([1, 2])
        others = [r["answer"] for r in data["command"]
                  if r["kind"] == row["kind"] and r["answer"] != row["answer"]]
        for j in range(3):
            reply = row["answer"] if j < good else rng.choice(others)
            out.append(([{"role": "system", "content": row["system"]},
                         {"role": "user", "content": row["question"]},
                         {"role": "assistant", "content": reply}], None))
    rng.shuffle(out)
    return out


def build_vocab(convs: list[Any]) -> list[str]:
    counts: collections.Counter[str] = collections.Counter()
    for msgs, tools in convs:
        texts = [m.get("content") or "" for m in msgs]
        for m in msgs:
            for c in m.get("tool_calls") or []:
                texts += [c["function"]["name"], c["function"]["arguments"]]
        if tools:
            texts += [json.dumps(t["function"]) for t in tools]
        for text in texts:
            for piece in _CHUNK.findall(text):
                if 2 <= len(piece) <= 16 and piece.isascii():
                    counts[piece] += 1
    ranked = sorted((p for p, c in counts.items() if c >= 2), key=lambda p: (-counts[p], p))
    return ranked[:N_PIECES]


def train() -> None:
    rng = random.Random(SEED)
    data = {"arithmetic": md.arithmetic(rng, 240), "tools": md.tool_tasks(rng, 160),
            "guess": md.guess_tasks(rng, 90), "command": md.command_tasks()}
    DATA.mkdir(parents=True, exist_ok=True)
    for name, rows in data.items():
        write_jsonl(DATA / f"{name}.jsonl", rows)
    (DATA / "tool_schemas.json").write_text(json.dumps(md.TOOLS, indent=2) + "\n")
    convs = transcripts(rng, data)
    tok = Tokenizer(build_vocab(convs))
    tpl = ChatTemplate(tok)
    stream: list[int] = []
    for msgs, tools in convs:
        stream += tpl.render(msgs, tools, add_generation_prompt=False)
    ASSETS.mkdir(parents=True, exist_ok=True)
    (ASSETS / "tokenizer.json").write_text(tok.to_json())
    np.savez_compressed(ASSETS / "model.npz", stream=np.array(stream, dtype=np.uint16),
                        gamma=np.float64(GAMMA), floor=np.float64(FLOOR))
    print(f"vocab {tok.vocab_size}, stream {len(stream)} tokens, {len(convs)} conversations")


# -- evaluation: play each environment exactly as documented --------------------------------


def chat(e: Engine, tpl: ChatTemplate, msgs: list[Any], tools: Any, temp: float,
         rng: np.random.Generator) -> Any:
    gen = Generation(e, tpl.render(msgs, tools), SamplingParams(temperature=temp, max_tokens=200),
                     rng)
    while gen.step() is not None:
        pass
    return tpl.parse(gen.tokens)


def answer_of(text: str) -> str | None:
    m = re.search(r"Answer: (-?[0-9.]+)\s*$", text)
    return m.group(1) if m else None


def play(e: Engine, env: str, row: dict[str, Any], temp: float, seed: int) -> bool:
    tpl = ChatTemplate(e.tok)
    rng = np.random.default_rng(seed)
    msgs: list[Any] = [{"role": "system", "content": row["system"]}]
    if env == "arithmetic":
        msgs.append({"role": "user", "content": row["question"]})
        return answer_of(chat(e, tpl, msgs, None, temp, rng).content) == row["answer"]
    if env == "command":
        msgs.append({"role": "user", "content": row["question"]})
        return md.command_correct(chat(e, tpl, msgs, None, temp, rng).content, row["answer"])
    if env == "tools":
        msgs.append({"role": "user", "content": row["question"]})
        for _ in range(3):
            turn = chat(e, tpl, msgs, md.TOOLS, temp, rng)
            if not turn.tool_calls:
                return answer_of(turn.content) == row["answer"]
            msgs.append({"role": "assistant", "content": turn.content or None, "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": n, "arguments": a}}
                for n, a in turn.tool_calls]})
            for n, a in turn.tool_calls:
                msgs.append({"role": "tool", "tool_call_id": "c", "content": md.run_tool(n, a)})
        return False
    msgs.append({"role": "user", "content": row["first_message"]})
    for _ in range(row["max_turns"]):
        turn = chat(e, tpl, msgs, None, temp, rng)
        msgs.append({"role": "assistant", "content": turn.content})
        fb = md.feedback(row["secret"], turn.content)
        if fb == "Correct!":
            return True
        msgs.append({"role": "user", "content": fb})
    return False


def evaluate() -> dict[str, dict[str, float]]:
    from tracewire.model._engine import get_engine

    e = get_engine()
    out: dict[str, dict[str, float]] = {}
    for env in ("arithmetic", "tools", "guess", "command"):
        rows = [json.loads(x) for x in (DATA / f"{env}.jsonl").read_text().splitlines()]
        res = {}
        for temp in (1.0, 0.0):
            wins = sum(play(e, env, r, temp, 1000 + i) for i, r in enumerate(rows))
            res[f"t{temp:g}"] = round(wins / len(rows), 3)
        out[env] = res
        print(env, res, flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--eval-only", action="store_true")
    args = ap.parse_args()
    if not args.eval_only:
        train()
    evaluate()


if __name__ == "__main__":
    main()
