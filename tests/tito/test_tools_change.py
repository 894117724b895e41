"""A request that drops or changes its tools re-renders (reason ``tools_changed``) where the
template renders tools, since the recorded ids hold the old tools block; where the template
ignores tools (SmolLM2's does), nothing the model sees changed and the branch goes on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from tracewire.compose import make_upstream
from tracewire.proxy import Proxy
from tracewire.tito import (
    ChatTokenizer,
    PromptBuilder,
    RerenderReason,
    TokenSession,
    TokenUpstream,
)
from tracewire.tito.fixtures import build_gguf_file

from .e2e_harness import Policy
from .fake_servers import Script, start_fake
from .helpers import TOOLS

OTHER_TOOLS = [{"type": "function", "function": {
    "name": "lookup", "description": "Look a key up in the other table.",
    "parameters": {"type": "object", "properties": {"i": {"type": "integer"}}}}}]
#: ChatML that never renders tools (as SmolLM2-Instruct's template).
NO_TOOLS_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + (m['content'] or '') + "
    "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}")


def _turns(s: TokenSession, tool_lists: list[Any]) -> list[Any]:
    """Plan one turn per entry of ``tool_lists`` (bridging from the last prompt + a sampled
    answer, as the proxy would match it); returns the plans."""
    b = s.builder
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
    base: list[int] | None = None
    plans = []
    for t, tools in enumerate(tool_lists):
        plan = s.plan_on(msgs, tools, new=1 if base is not None else len(msgs),
                         base_ids=base, base_sampled=base is not None)
        plans.append(plan)
        answer = f"answer {t}"
        comp = [*b.tok.encode(answer), b.family.stop_ids[0]]
        base = [*plan.prompt_ids, *comp]
        msgs = [*msgs, {"role": "assistant", "content": answer},
                {"role": "user", "content": f"more {t}"}]
    return plans


def test_dropped_or_changed_tools_rerender(toks: dict[str, ChatTokenizer]) -> None:
    b = PromptBuilder(toks["qwen25"])
    s = TokenSession(b)
    plans = _turns(s, [TOOLS, TOOLS, None, None, OTHER_TOOLS, OTHER_TOOLS])
    reasons = [p.reason for p in plans]
    assert reasons == [None, None, RerenderReason.TOOLS_CHANGED, None,
                       RerenderReason.TOOLS_CHANGED, None]
    assert [p.new_branch for p in plans] == [True, False, True, False, True, False]
    assert dict(s.rerenders) == {"tools_changed": 2}
    # The re-rendered prompt has no tools block; the bridged one before it had.
    tools_text = "# Tools"
    assert tools_text in b.tok.decode(plans[1].prompt_ids)
    assert tools_text not in b.tok.decode(plans[2].prompt_ids)
    assert plans[2].prompt_ids == b.render_full(plans[2].messages).ids
    assert "other table" in b.tok.decode(plans[4].prompt_ids)
    # After a re-render the branch bridges again from its new ids.
    assert plans[3].prompt_ids[:len(plans[2].prompt_ids)] == plans[2].prompt_ids


def test_tools_a_template_ignores_keep_the_branch(tmp_path: Path) -> None:
    tok = ChatTokenizer(build_gguf_file(tmp_path / "t.gguf", "qwen25",
                                        template=NO_TOOLS_TEMPLATE))
    s = TokenSession(PromptBuilder(tok))
    plans = _turns(s, [TOOLS, None, OTHER_TOOLS])
    assert [p.reason for p in plans] == [None, None, None]
    assert [p.new_branch for p in plans] == [True, False, False]
    assert dict(s.rerenders) == {}


def test_the_standalone_index_rerenders_too(toks: dict[str, ChatTokenizer]) -> None:
    b = PromptBuilder(toks["qwen25"])
    s = TokenSession(b)
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
    p1 = s.plan(msgs, TOOLS)
    s.commit(p1, {"role": "assistant", "content": "a"},
             [*b.tok.encode("a"), b.family.stop_ids[0]], True)
    msgs = [*msgs, {"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}]
    assert s.plan(msgs, TOOLS).reason is None  # a bridge
    p3 = s.plan(msgs, None)
    assert p3.reason is RerenderReason.TOOLS_CHANGED and p3.new_branch
    # A retry of the first request without its tools: the recorded prompt ids hold the
    # tools block, so they are not reused.
    assert s.plan(msgs[:1], None).reason is RerenderReason.TOOLS_CHANGED


@pytest.mark.parametrize("dropped", [True, False])
async def test_through_the_proxy_the_summary_counts_it(tok_dirs: dict[str, Path],
                                                       toks: dict[str, ChatTokenizer],
                                                       dropped: bool) -> None:
    # Dropped (tools, then none) or added (none, then tools): the summary's mismatch report
    # renders each branch with the tools it was rendered with, so both report 0.
    b = PromptBuilder(toks["qwen25"])
    policy = Policy(b, "qwen25", turns=1)  # answers in text
    runner, base = await start_fake(Script(ids=[], policy=policy))
    up = make_upstream(base + "/v1", tokenizer=str(tok_dirs["qwen25"]), model="m")
    assert isinstance(up, TokenUpstream)
    try:
        async with Proxy(up) as proxy:
            s = proxy.create_session()
            client = openai.AsyncOpenAI(base_url=s.base_url, api_key=s.secret, max_retries=0)
            msgs: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
            order = (TOOLS, TOOLS, None, None) if dropped else (None, None, TOOLS, TOOLS)
            for tools in order:
                kw: dict[str, Any] = {"tools": tools} if tools else {}
                r = await client.chat.completions.create(model="m", messages=msgs,  # type: ignore[arg-type]
                                                         max_tokens=32, **kw)
                msgs += [r.choices[0].message.model_dump(exclude_none=True),
                         {"role": "user", "content": "go on"}]
            await client.close()
            # The prompt after the change carries the new tools block (or none).
            assert ("# Tools" in b.tok.decode(policy.log[1][0])) is dropped
            assert ("# Tools" in b.tok.decode(policy.log[2][0])) is not dropped
            assert policy.log[3][0][:len(policy.log[2][0])] == policy.log[2][0]
            async with aiohttp.ClientSession(headers={
                    "Authorization": f"Bearer {proxy.session_token}"}) as http, \
                    http.get(f"{proxy.url}/sessions/{s.id}") as resp:
                summary = await resp.json()
    finally:
        await runner.cleanup()
    assert summary["tito"]["rerenders"] == {"tools_changed": 1}
    assert summary["tito"]["rerender_turns"] == [2]
    assert summary["tito_mismatch"] == 0
