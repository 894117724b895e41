"""Tools a Responses harness offers that have no chat-completions form (hosted tools such
as Codex's ``web_search``, tool namespaces such as its ``multi_agent_v1``) are not forwarded,
and the trace says so: a flag and the names on each call, the names in ``trace.info``, and
counts in the session summary."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from tracewire.proxy import Proxy

from .fake_upstream import Fake

# The shapes Codex sends (recorded from `codex exec`, descriptions shortened).
TOOLS: list[dict[str, Any]] = [
    {"type": "function", "name": "exec_command", "description": "run a command",
     "strict": False, "parameters": {"type": "object", "properties": {
         "cmd": {"type": "string"}}, "required": ["cmd"]}},
    {"type": "namespace", "name": "multi_agent_v1", "description": "sub-agents", "tools": [
        {"type": "function", "name": "spawn_agent", "description": "start one",
         "parameters": {"type": "object", "properties": {}}}]},
    {"type": "web_search", "external_web_access": True},
]


async def post(proxy: Proxy, secret: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as c, c.post(
            proxy.url + "/v1/responses", json=body,
            headers={"Authorization": f"Bearer {secret}"}) as r:
        return r.status, await r.json() if not body.get("stream") else await r.text()


@pytest.mark.parametrize("stream", [False, True])
async def test_unforwarded_tools_are_recorded(proxy: Proxy, fake: Fake, stream: bool) -> None:
    s = proxy.create_session()
    body = {"model": "fake-model", "input": "hello", "tools": TOOLS, "stream": stream}
    st, _ = await post(proxy, s.secret, body)
    assert st == 200
    # Only the function tool reached the upstream.
    (req,) = fake.requests
    assert [t["function"]["name"] for t in req["tools"]] == ["exec_command"]
    (call,) = s.trace.calls
    assert call.error is None
    assert call.flags[0] == "tools_not_forwarded"
    assert set(call.flags[1:]) == {"tools_not_forwarded:multi_agent_v1",
                                   "tools_not_forwarded:web_search"}
    assert s.trace.info["tools_not_forwarded"] == ["multi_agent_v1", "web_search"]


async def test_failed_calls_keep_the_flags_and_summary_counts(proxy: Proxy, fake: Fake) -> None:
    s = proxy.create_session()
    body = {"model": "fake-model", "input": "hello", "tools": TOOLS}
    fake.fail_next = 1
    st, _ = await post(proxy, s.secret, body)
    assert st >= 500
    st, _ = await post(proxy, s.secret, body)
    assert st == 200
    assert len(s.trace.calls) == 2 and s.trace.calls[0].error is not None
    assert all("tools_not_forwarded:web_search" in c.flags for c in s.trace.calls)
    async with aiohttp.ClientSession() as c, c.get(
            f"{proxy.url}/sessions/{s.id}",
            headers={"Authorization": f"Bearer {proxy.session_token}"}) as r:
        assert r.status == 200
        summary = await r.json()
    assert summary["tools_not_forwarded"] == {"multi_agent_v1": 2, "web_search": 2}


async def test_function_tools_only_leave_no_trace_of_the_feature(proxy: Proxy) -> None:
    s = proxy.create_session()
    st, _ = await post(proxy, s.secret, {"model": "fake-model", "input": "hi",
                                         "tools": TOOLS[:1]})
    assert st == 200
    assert s.trace.calls[0].flags == () and "tools_not_forwarded" not in s.trace.info
    async with aiohttp.ClientSession() as c, c.get(
            f"{proxy.url}/sessions/{s.id}",
            headers={"Authorization": f"Bearer {proxy.session_token}"}) as r:
        assert "tools_not_forwarded" not in await r.json()
