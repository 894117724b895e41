"""Token fidelity: each turn's prompt ids start with the previous prompt ids + sampled ids."""

from __future__ import annotations

import json
from pathlib import Path

import model_data as md
import openai
import pytest

from tracewire.model import MODEL_NAME, load_tokenizer


def _check_prefix(prev: list[int] | None, prompt: list[int]) -> None:
    if prev is not None:
        assert prompt[: len(prev)] == prev


@pytest.mark.parametrize("as_object", [False, True])
def test_multi_turn_tools_fidelity(base_url: str, as_object: bool) -> None:
    client = openai.OpenAI(base_url=base_url, api_key="none")
    data = Path(__file__).resolve().parents[2] / "src/tracewire/env/bundled/data/tools.jsonl"
    rows = [json.loads(x) for x in data.read_text().splitlines()]
    eot = load_tokenizer().eot_id
    for seed in range(25):
        row = rows[seed]
        msgs: list[object] = [{"role": "system", "content": row["system"]},
                              {"role": "user", "content": row["question"]}]
        prev: list[int] | None = None
        for _turn in range(3):
            r = client.chat.completions.create(
                model=MODEL_NAME, messages=msgs, tools=md.TOOLS, seed=seed,  # type: ignore[arg-type]
                temperature=1.4, max_tokens=200, extra_body={"return_token_ids": True})
            c = r.choices[0]
            prompt = r.model_extra["prompt_token_ids"]  # type: ignore[index]
            _check_prefix(prev, prompt)
            if c.finish_reason == "length":
                break
            prev = prompt + c.model_extra["token_ids"]  # type: ignore[index]
            assert prev[-1] == eot
            msgs.append(c.message if as_object else c.message.model_dump(exclude_none=True))
            if not c.message.tool_calls:
                msgs.append({"role": "user", "content": "Are you sure? ✓"})
                continue
            for call in c.message.tool_calls:
                msgs.append({"role": "tool", "tool_call_id": call.id,
                             "content": md.run_tool(call.function.name, call.function.arguments)})  # type: ignore[union-attr]


def test_guess_game_fidelity(base_url: str) -> None:
    client = openai.OpenAI(base_url=base_url, api_key="none")
    for seed in range(15):
        msgs: list[dict[str, object]] = [
            {"role": "system", "content": md.GUESS_SYSTEM},
            {"role": "user", "content": md.guess_intro(1, 50, 5)}]
        prev: list[int] | None = None
        for _turn in range(5):
            r = client.chat.completions.create(model=MODEL_NAME, messages=msgs, seed=seed,  # type: ignore[arg-type]
                                               temperature=2.0, max_tokens=50,
                                               extra_body={"return_token_ids": True})
            prompt = r.model_extra["prompt_token_ids"]  # type: ignore[index]
            _check_prefix(prev, prompt)
            c = r.choices[0]
            if c.finish_reason != "stop":
                break
            prev = prompt + c.model_extra["token_ids"]  # type: ignore[index]
            msgs.append({"role": "assistant", "content": c.message.content})
            msgs.append({"role": "user", "content": md.feedback(29, c.message.content or "")})
