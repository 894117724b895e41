"""The side-by-side on the real model: the conversations of the token-exact tests, through
llama-server's own chat endpoint. Token-in/token-out records what was sampled (the other
tests prove it on the wire); the chat endpoint's next turn re-tokenizes the reply's text.
This checks the measurement itself; ``bench/engine_retokenize.py`` reports the figure."""

from __future__ import annotations

from pathlib import Path

from .conftest import LlamaServerProc
from .sidebyside import chat_side


async def test_chat_side_counts_retokenized_turns(llama_server: LlamaServerProc,
                                                  tmp_path: Path) -> None:
    tally = await chat_side("arithmetic", 4, llama_server.url, tmp_path / "run", seed=7)
    assert tally.turns + tally.tool_call_turns == 4  # one reply per single-turn task
    assert tally.tokens > 0
    assert 0 <= tally.differ <= tally.turns
    assert (tally.differ == 0) == (tally.tokens_differ == 0)
    for text, sampled, again in tally.examples:
        # A counted turn really is other ids for the same reply.
        assert sampled != again and text
