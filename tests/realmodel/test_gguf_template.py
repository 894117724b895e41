"""The GGUF file's chat template renders here as llama-server renders it (``/apply-template``),
and the token-in/token-out prompt of a multi-turn conversation — recorded ids + junction +
suffix — is the ids llama-server's own chat path would tokenize when the model's answers are
canonical."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tracewire.tito import ChatTokenizer, PromptBuilder, TokenSession

from .conftest import LlamaServerProc

CONVERSATIONS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+3?"}],
    [{"role": "user", "content": "Name a city."}, {"role": "assistant", "content": "Paris."},
     {"role": "user", "content": "Another, in 日本 🙂"}],
    [{"role": "system", "content": ""}, {"role": "user", "content": "  spaces\n\ttabs  "}],
    [{"role": "user", "content": "<|im_start|>inline specials<|im_end|>"}],
]


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(url, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        out: dict[str, Any] = json.loads(r.read())
    return out


@pytest.fixture(scope="module")
def builder(smollm_gguf: Path) -> PromptBuilder:
    return PromptBuilder(ChatTokenizer(smollm_gguf))


@pytest.mark.parametrize("msgs", CONVERSATIONS)
def test_template_renders_as_llama_server(builder: PromptBuilder, llama_server: LlamaServerProc,
                                          msgs: list[dict[str, Any]]) -> None:
    theirs = _post(llama_server.url + "/apply-template", {"messages": msgs})["prompt"]
    assert builder.tok.render(msgs, add_generation_prompt=True) == theirs


def test_bridged_prompts_equal_the_servers_own_tokenization(
        builder: PromptBuilder, llama_server: LlamaServerProc) -> None:
    tok = builder.tok
    s = TokenSession(builder)
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "Count to three."}]
    answers = ["One, two, three.", "Four!\n\nFive.", "done"]
    for t, answer in enumerate(answers):
        plan = s.plan(msgs)
        prompt = _post(llama_server.url + "/apply-template", {"messages": msgs})["prompt"]
        ids = _post(llama_server.url + "/tokenize", {"content": prompt,
                                                     "parse_special": True})["tokens"]
        assert plan.prompt_ids == ids, t
        assert plan.new_branch is (t == 0)
        comp = [*tok.encode(answer), builder.family.stop_ids[0]]
        s.commit(plan, {"role": "assistant", "content": answer}, comp, True)
        msgs = [*msgs, {"role": "assistant", "content": answer},
                {"role": "user", "content": f"and then {t}?"}]
    assert s.bridges == len(answers) - 1 and not s.rerenders


def test_tools_smollm_ignores_keep_the_branch(builder: PromptBuilder,
                                              llama_server: LlamaServerProc) -> None:
    # SmolLM2's template renders no tools: adding or dropping them changes nothing the
    # model sees, so the branch goes on (no tools_changed re-render), and each prompt is
    # still what the server renders for the same request, tools included.
    tools = [{"type": "function", "function": {"name": "lookup", "description": "Look up.",
                                               "parameters": {"type": "object"}}}]
    tok = builder.tok
    s = TokenSession(builder)
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
    base: list[int] | None = None
    for t, ts in enumerate([tools, None, tools]):
        plan = s.plan_on(msgs, ts, new=1 if base else len(msgs), base_ids=base,
                         base_sampled=base is not None)
        body: dict[str, Any] = {"messages": msgs, **({"tools": ts} if ts else {})}
        prompt = _post(llama_server.url + "/apply-template", body)["prompt"]
        assert plan.prompt_ids == _post(llama_server.url + "/tokenize", {
            "content": prompt, "parse_special": True})["tokens"], t
        answer = f"answer {t}"
        base = [*plan.prompt_ids, *tok.encode(answer), builder.family.stop_ids[0]]
        msgs = [*msgs, {"role": "assistant", "content": answer},
                {"role": "user", "content": "more"}]
    assert s.bridges == 2 and not s.rerenders
