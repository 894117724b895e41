"""Token-in/token-out end to end: real SDK harnesses → a real Proxy whose upstream is built
by the composition root's factory from a tokenizer directory (the path ``--tokenizer``
takes) → a fake vLLM ``/v1/completions`` that samples from the prompt ids.

For each fixture template and dialect, streamed and not, a 20-turn tool loop stays one
branch whose ids are exactly the model's sampled ids plus the rendered suffixes (mask and
logprobs exact, mismatch report 0), non-canonical samples included; the same conversation
through the chat pass-through (a fake that re-renders history like vLLM) re-roots.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from aiohttp import web

from tracewire.compose import make_upstream
from tracewire.proxy import Proxy, ProxyConfig, Session
from tracewire.tito import ChatTokenizer, PromptBuilder, TokenUpstream

from .e2e_harness import LOOPS, TURNS, Policy, chat_app, chat_loop, lps
from .fake_servers import Script, start_fake


@contextlib.asynccontextmanager
async def _tito_proxy(tok_dir: Path, policy: Policy) -> AsyncIterator[Proxy]:
    runner, base = await start_fake(Script(ids=[], policy=policy))
    up = make_upstream(base + "/v1", tokenizer=str(tok_dir), model="m")
    assert isinstance(up, TokenUpstream)
    try:
        async with Proxy(up) as proxy:
            yield proxy
    finally:
        await runner.cleanup()


def _roots(s: Session) -> int:
    return sum(1 for n in s.trace.nodes if n.parent is None)


def _check_branch(s: Session, policy: Policy) -> None:
    """The branch is exactly the last prompt + its completion; every turn's prompt extends
    the previous prompt + completion; mask and logprobs sit on the sampled ids only."""
    t = s.trace
    br = t.branch()
    last_prompt, last_ids = policy.log[-1]
    assert br.ids.tolist() == last_prompt + last_ids
    mask = np.zeros(len(br), dtype=np.uint8)
    want_lp = np.zeros(len(br), dtype=np.float32)
    for k, (prompt, ids) in enumerate(policy.log):
        if k:
            prev_p, prev_i = policy.log[k - 1]
            assert prompt[:len(prev_p) + len(prev_i)] == prev_p + prev_i
        mask[len(prompt):len(prompt) + len(ids)] = 1
        want_lp[len(prompt):len(prompt) + len(ids)] = lps(len(ids))
    assert np.array_equal(br.mask, mask)
    assert np.allclose(br.logprobs[mask == 1], want_lp[mask == 1])


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("dialect", sorted(LOOPS))
async def test_tool_loop_one_branch(tok_dirs: dict[str, Path], toks: dict[str, ChatTokenizer],
                                    family: str, dialect: str, stream: bool) -> None:
    b = PromptBuilder(toks[family])
    policy = Policy(b, family)
    async with _tito_proxy(tok_dirs[family], policy) as proxy:
        s = proxy.create_session()
        await LOOPS[dialect](s, stream)
        assert len(policy.log) == TURNS
        assert all(c.error is None for c in s.trace.calls), [c.error for c in s.trace.calls]
        assert _roots(s) == 1 and not s.trace.info.get("token_mismatches")
        _check_branch(s, policy)
        assert any(len(ids) > len(b.tok.encode(b.tok.decode(ids[:-1]))) + 1
                   for _, ids in policy.log)  # non-canonical samples were in the loop
        await proxy.finish_session(s.id)
        info = s.trace.info
        assert info["tito_mismatch"] == 0, info["tito"]
        assert info["tito"]["bridges"] == TURNS - 1 and info["tito"]["rerenders"] == {}


async def test_pass_through_reroots_where_tito_does_not(
        tok_dirs: dict[str, Path], toks: dict[str, ChatTokenizer], family: str) -> None:
    b = PromptBuilder(toks[family])
    turns = 6
    policy = Policy(b, family, turns=turns)
    app = chat_app(b, policy)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    try:
        assert make_upstream(url, ProxyConfig()) == url  # no tokenizer: pass-through
        async with Proxy(url) as proxy:
            s = proxy.create_session()
            await chat_loop(s, False, turns)
            # vLLM-style re-rendering replaces non-canonical samples (and, for Qwen3, past
            # <think> blocks): the recorded prompt no longer extends the branch.
            assert s.trace.info.get("token_mismatches", 0) >= 1 and _roots(s) > 1
    finally:
        await runner.cleanup()
    policy2 = Policy(b, family, turns=turns)
    async with _tito_proxy(tok_dirs[family], policy2) as proxy:
        s = proxy.create_session()
        await chat_loop(s, False, turns)
        assert _roots(s) == 1 and not s.trace.info.get("token_mismatches")
        _check_branch(s, policy2)


async def test_compaction_and_system_change_open_counted_branches(
        tok_dirs: dict[str, Path], toks: dict[str, ChatTokenizer]) -> None:
    family = "qwen25"
    b = PromptBuilder(toks[family])
    policy = Policy(b, family, turns=100)
    async with _tito_proxy(tok_dirs[family], policy) as proxy:
        s = proxy.create_session()
        msgs = await chat_loop(s, False, 4)
        # The harness compacts: a summary replaces the turns so far.
        compacted: list[dict[str, Any]] = [msgs[0], {"role": "user", "content": "summary"}]
        msgs = await chat_loop(s, False, 3, history=compacted)
        up = proxy.upstream
        assert isinstance(up, TokenUpstream)
        st = up.state(s.id)
        assert dict(st.session.rerenders) == {"history_changed": 1}
        # A second branch (forking at the shared system prompt, which holds no ids).
        assert len(s.trace.leaves()) == 2
        # After the re-render the new branch bridges again: its last prompt extends the
        # re-rendered one verbatim.
        (p1, i1), (p2, _) = policy.log[-2:]
        assert p2[:len(p1) + len(i1)] == p1 + i1
        await chat_loop(s, False, 1, history=[{"role": "system", "content": "Be long."},
                                              *msgs[1:]])
        assert dict(st.session.rerenders) == {"history_changed": 1, "system_changed": 1}
        assert len(s.trace.leaves()) == 3 and _roots(s) == 2
        # The trainer's session summary carries the report (computed off the loop).
        async with aiohttp.ClientSession(headers={
                "Authorization": f"Bearer {proxy.session_token}"}) as http, \
                http.get(f"{proxy.url}/sessions/{s.id}") as r:
            assert r.status == 200
            summary = await r.json()
        assert summary["tito_mismatch"] == 0
        assert summary["tito"]["rerenders"] == {"history_changed": 1, "system_changed": 1}
        assert summary["tito"]["branches"] == 3


async def test_length_cut_turn_gets_a_synthesized_close(
        tok_dirs: dict[str, Path], toks: dict[str, ChatTokenizer], family: str) -> None:
    b = PromptBuilder(toks[family])
    policy = Policy(b, family, turns=100, special={1: "length"})
    async with _tito_proxy(tok_dirs[family], policy) as proxy:
        s = proxy.create_session()
        await chat_loop(s, False, 4)
        assert [c.finish_reason for c in s.trace.calls][1] == "length"
        # The documented rule (LengthRule.CLOSE): the next prompt is the cut ids verbatim,
        # then the template's close token, then the suffix.
        (p1, i1), (p2, _) = policy.log[1], policy.log[2]
        assert i1[-1] not in b.family.stop_ids
        assert p2[:len(p1) + len(i1)] == p1 + i1
        assert p2[len(p1) + len(i1)] == b.family.stop_ids[0]
        assert _roots(s) == 1


@pytest.mark.parametrize("stream", [False, True])
async def test_malformed_tool_call_is_text_with_a_flag(
        tok_dirs: dict[str, Path], toks: dict[str, ChatTokenizer], family: str,
        stream: bool) -> None:
    b = PromptBuilder(toks[family])
    policy = Policy(b, family, turns=100, special={1: "malformed"})
    async with _tito_proxy(tok_dirs[family], policy) as proxy:
        s = proxy.create_session()
        msgs = await chat_loop(s, stream, 3)
        bad = [m for m in msgs if m["role"] == "assistant"][1]
        assert not bad.get("tool_calls") and "oops" in (bad["content"] or "")
        flags = [c.flags for c in s.trace.calls]
        assert flags[1] == ("malformed_tool_call",) and flags[0] == () == flags[2]
        assert _roots(s) == 1
        await proxy.finish_session(s.id)
        assert s.trace.info["tito"]["malformed_tool_calls"] == 1


async def test_eval_with_a_tokenizer_reports_tito_mismatch(
        tok_dirs: dict[str, Path], toks: dict[str, ChatTokenizer], tmp_path: Path) -> None:
    # `tracewire eval --base-url URL --tokenizer DIR`: the episode's mismatch report lands in
    # its index row (tito_mismatch) and the eval summary.
    from tracewire.compose import evaluate

    family = "qwen25"
    b = PromptBuilder(toks[family])
    policy = Policy(b, family, turns=1)  # answers in text at once
    runner, base = await start_fake(Script(ids=[], policy=policy))
    try:
        result = await evaluate("arithmetic", model="m", base_url=base + "/v1", n=2,
                                concurrency=1, out=tmp_path / "run",
                                tokenizer=str(tok_dirs[family]))
    finally:
        await runner.cleanup()
    assert len(policy.log) >= 2  # every turn went through the token-in endpoint
    assert result.summary.tito_mismatch == 0
    rows = result.run.rows()
    assert [r.tito_mismatch for r in rows] == [0, 0]
    await result.run.close()
