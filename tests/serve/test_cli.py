"""``tracewire serve`` as the command line runs it: compose's model options reach the runner
factory as they did when serve defined them (a real CLI process, real worker processes)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from tracewire.serve import EnvClient

from .conftest import ADDRESS

ROOT = Path(__file__).resolve().parents[2]
RUNNER = "tests.serve._options_runner:options_factory"


async def _options_seen(*flags: str) -> dict[str, Any]:
    """The ``agent`` field of one episode run by ``tracewire serve standin --runner RUNNER
    *flags``: the environment and options the factory was called with."""
    # The broker and its workers import the recording runner from the checkout.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tracewire", "serve", "standin", "--address", ADDRESS,
        "--workers", "1", "--runner", RUNNER, "--drain-timeout", "1", *flags,
        stdout=asyncio.subprocess.PIPE, env=env)
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        assert line.startswith("serving standin on tcp://127.0.0.1:"), line
        key_line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        assert key_line.startswith("client key file: "), key_line
        async with EnvClient(line.split()[-1], key_file=key_line.split()[3]) as client:
            res = await asyncio.wait_for(client.run({}), 60)
        proc.terminate()
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    (trace,) = res.episode.traces
    agent: dict[str, Any] = trace.agent
    return agent


async def test_model_flags_reach_the_runner_factory_after_the_options(tmp_path: Path) -> None:
    # As before the flags moved to compose: --option's first, then the model flags given,
    # over any --option of the same key. The command line checks --tokenizer's path (not
    # its content) before serving, so it names a directory holding a tokenizer.json.
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_text("{}")
    agent = await _options_seen(
        "--option", "turns=2", "--option", 'tokenizer="ignored"',
        "--tokenizer", str(tok), "--upstream-api", "generate",
        "--base-url", "http://127.0.0.1:9/v1")
    assert agent["env"] == "standin"
    assert agent["options"] == {"turns": 2, "tokenizer": str(tok),
                                "base_url": "http://127.0.0.1:9/v1",
                                "upstream_api": "generate"}
    assert agent["keys"] == ["turns", "tokenizer", "base_url", "upstream_api"]


async def test_model_flags_not_given_add_no_option() -> None:
    agent = await _options_seen("--option", "turns=3")
    assert agent["options"] == {"turns": 3}
