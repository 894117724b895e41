"""Fixtures for the env tests: one built-in model server per session, a proxy per test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import msgspec
import numpy as np
import pytest

from tracewire.model import ChatTemplate, ModelServer, ServerThread, load_tokenizer
from tracewire.proxy import Proxy
from tracewire.trace import Trace


@pytest.fixture(scope="session")
def model() -> Iterator[ServerThread]:
    """The built-in model on its own thread, shared by the whole session."""
    server = ModelServer.run_in_thread()
    yield server
    server.stop()


@pytest.fixture
async def proxy(model: ServerThread) -> AsyncIterator[Proxy]:
    """A proxy in front of the built-in model."""
    async with Proxy(model.base_url) as p:
        yield p


@pytest.fixture(scope="session")
def template() -> ChatTemplate:
    """The built-in model's chat template (to re-render prompts independently)."""
    return ChatTemplate(load_tokenizer())


def _as_dict(message: Any) -> dict[str, Any]:
    d: dict[str, Any] = msgspec.to_builtins(message)
    if message.tool_calls:
        d["tool_calls"] = [
            {"id": c.id, "type": "function",
             "function": {"name": c.name, "arguments": c.arguments}}
            for c in message.tool_calls
        ]
    return d


def check_token_exact(
    trace: Trace, template: ChatTemplate, tools: list[dict[str, Any]] | None = None
) -> int:
    """Every successful call's branch = the chat template's rendering of the prompt messages
    (prompt ids, as the model saw them) followed by the sampled ids; returns calls checked."""
    checked = 0
    for call in trace.calls:
        if call.node is None:
            continue
        branch = trace.branch(call.node)
        node = trace.nodes[call.node]
        assert node.sampled and node.has_tokens
        completion = trace.columns.ids[node.start : node.end]
        prompt_msgs = [_as_dict(trace.nodes[i].message) for i in branch.nodes[:-1]]
        want_prompt = template.render(prompt_msgs, tools)
        ids = branch.ids
        assert ids.tolist() == [*want_prompt, *completion.tolist()]
        assert call.usage["prompt_tokens"] == len(want_prompt)
        assert call.usage["completion_tokens"] == len(completion)
        # Loss mask: exactly the sampled nodes' tokens along the branch.
        sampled = np.concatenate(
            [np.full(trace.nodes[i].end - trace.nodes[i].start, int(trace.nodes[i].sampled))
             for i in branch.nodes]
        )
        assert branch.mask.tolist() == sampled.tolist()
        assert not np.isnan(trace.columns.logprobs[node.start : node.end]).any()
        checked += 1
    return checked
