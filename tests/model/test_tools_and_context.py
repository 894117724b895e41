"""Declared tool names constrain sampled calls; the context length is configurable (issue 17)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import model_data as md
import openai
import pytest

from tracewire._errors import ModelError
from tracewire.model import MODEL_NAME, ChatTemplate, ModelServer, load_tokenizer

# A tool the model never saw in training, next to a prompt that makes it want "calculator".
ODD_TOOL = {"type": "function", "function": {
    "name": "zz_lookup", "description": "look something up",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}


def _msgs() -> list[dict[str, str]]:
    return [{"role": "system", "content": md.TOOLS_SYSTEM},
            {"role": "user", "content": "Use the calculator to compute (47 + 5) * 3."}]


@pytest.mark.parametrize("choice", ["auto", "required"])
def test_sampled_tool_names_are_declared(base_url: str, choice: str) -> None:
    client = openai.OpenAI(base_url=base_url, api_key="none")
    names: list[str] = []
    for tools in ([ODD_TOOL], [md.CONVERT, ODD_TOOL]):
        declared = {t["function"]["name"] for t in tools}  # type: ignore[index]
        r = client.chat.completions.create(model=MODEL_NAME, messages=_msgs(),  # type: ignore[arg-type]
                                           tools=tools, tool_choice=choice,  # type: ignore[arg-type]
                                           n=16, seed=3, temperature=1.0, max_tokens=200)
        for c in r.choices:
            for call in c.message.tool_calls or []:
                assert call.function.name in declared  # type: ignore[union-attr]
                names.append(call.function.name)  # type: ignore[union-attr]
    # the model does call tools here (so the check above is not vacuous)
    assert names
    if choice == "required":
        assert len(names) >= 32


def test_streamed_tool_names_are_declared(base_url: str) -> None:
    client = openai.OpenAI(base_url=base_url, api_key="none")
    seen: list[str] = []
    for seed in range(6):
        stream = client.chat.completions.create(
            model=MODEL_NAME, messages=_msgs(), tools=[ODD_TOOL], tool_choice="required",  # type: ignore[arg-type]
            seed=seed, stream=True, max_tokens=200)
        for chunk in stream:
            for c in chunk.choices:
                for tc in c.delta.tool_calls or []:
                    if tc.function is not None and tc.function.name:
                        seen.append(tc.function.name)
    assert seen and set(seen) == {"zz_lookup"}


def test_declared_tools_read_back_from_prompt_ids() -> None:
    tpl = ChatTemplate(load_tokenizer())
    ids = tpl.render(_msgs(), [md.CALCULATOR, ODD_TOOL])
    assert tpl.declared_tools(ids) == ("calculator", "zz_lookup")
    ids = tpl.render([{"role": "user", "content": "hi"}], [ODD_TOOL])  # system turn added
    assert tpl.declared_tools(ids) == ("zz_lookup",)
    assert tpl.declared_tools(tpl.render(_msgs())) is None


def test_max_model_len_is_configurable() -> None:
    long_text = "the quick brown fox jumps over the lazy dog " * 3000  # ~ >8,192 tokens
    msgs = [{"role": "system", "content": long_text}, {"role": "user", "content": "hi"}]
    with ModelServer.run_in_thread(max_model_len=200_000) as big, \
            ModelServer.run_in_thread() as small:
        c_big = openai.OpenAI(base_url=big.base_url, api_key="none")
        c_small = openai.OpenAI(base_url=small.base_url, api_key="none", max_retries=0)
        (m,) = c_big.models.list().data
        assert (m.model_extra or {})["max_model_len"] == 200_000
        r = c_big.chat.completions.create(model=MODEL_NAME, messages=msgs, max_tokens=5,  # type: ignore[arg-type]
                                          seed=1)
        assert r.usage is not None and r.usage.prompt_tokens > 8192
        with pytest.raises(openai.BadRequestError, match="8192"):
            c_small.chat.completions.create(model=MODEL_NAME, messages=msgs, max_tokens=5)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0, -1, True, 1 << 40])
def test_max_model_len_is_bounded(bad: int) -> None:
    with pytest.raises(ModelError, match="max_model_len"):
        ModelServer(max_model_len=bad)


def test_cli_max_model_len() -> None:
    proc = subprocess.Popen([sys.executable, "-m", "tracewire", "model", "--port", "0",
                             "--max-model-len", "65536"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")

        async def models() -> dict[str, object]:
            import aiohttp
            async with aiohttp.ClientSession() as http, http.get(url + "/models") as resp:
                return json.loads(await resp.text())  # type: ignore[no-any-return]

        body = asyncio.run(models())
        assert body["data"][0]["max_model_len"] == 65536  # type: ignore[index]
    finally:
        proc.terminate()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
