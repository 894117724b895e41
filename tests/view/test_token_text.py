"""Token text in the viewer: the run's tokenizer served as a vocabulary table (JSON API and
a real browser), for the built-in model's tokenizer and for a tokenizer directory."""

from __future__ import annotations

import asyncio
import concurrent.futures
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import orjson
import pytest
from playwright.sync_api import expect

from tracewire.model import MODEL_NAME, load_tokenizer
from tracewire.tito import ChatTokenizer
from tracewire.tito.fixtures import build_tokenizer_dir
from tracewire.trace import Episode, Message
from tracewire.view import ViewServer

from .builders import write_run
from .test_api import get_json

PROMPT = "<|im_start|>user\nhi there, tool<|im_end|>\n<|im_start|>assistant\n"
ANSWER = "Sure: call it.<|im_end|>"


def token_episode(prompt: list[int], answer: list[int]) -> Episode:
    """One prompt node and one sampled answer node with the given ids."""
    ep = Episode(env="tok", task_key="text")
    tr = ep.new_trace()
    u = tr.add_node(Message(role="user", content="hi"), ids=prompt)
    tr.add_node(Message(role="assistant", content="answer"), parent=u, sampled=True,
                ids=answer, logprobs=np.full(len(answer), -0.5, dtype=np.float32))
    tr.stop = "done"
    return ep


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tokenizer_dir(tmp_path_factory.mktemp("tok") / "qwen25", "qwen25")


async def vocab_of(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    async with ViewServer(path) as srv, aiohttp.ClientSession() as s:
        info = await get_json(s, srv.url + "/api/run")
        vocab = await get_json(s, srv.url + "/api/vocab")
        again = await get_json(s, srv.url + "/api/vocab")
        assert again == vocab  # built once, served the same
    return info, vocab


async def test_builtin_tokenizer_pieces(tmp_path: Path) -> None:
    tok = load_tokenizer()
    prompt = tok.encode_with_special("<|user|>What is 2 + 2?<|eot|>")
    answer = tok.encode_with_special("<|assistant|>It is 4.<|eot|>")
    ep = token_episode(prompt, answer)
    await write_run(tmp_path / "run", [ep], meta={"name": "b", "model": MODEL_NAME})
    info, vocab = await vocab_of(tmp_path / "run")
    assert info["tokenizer"] == {"known": True, "kind": "builtin", "name": MODEL_NAME,
                                 "reason": None}
    assert vocab["known"] and vocab["size"] == tok.vocab_size == len(vocab["pieces"])
    ids = [*prompt, *answer]
    assert "".join(vocab["pieces"][i] for i in ids) == tok.decode(ids)
    assert set(vocab["special"]) == set(tok.special.values())
    assert vocab["pieces"][tok.eot_id] == "<|eot|>"


async def test_tokenizer_directory_pieces(tmp_path: Path, qwen_dir: Path) -> None:
    tok = ChatTokenizer(qwen_dir)
    prompt, answer = tok.encode(PROMPT), tok.encode(ANSWER)
    ep = token_episode(prompt, answer)
    await write_run(tmp_path / "run", [ep], meta={"name": "d", "tokenizer": str(qwen_dir)})
    info, vocab = await vocab_of(tmp_path / "run")
    assert info["tokenizer"]["known"] and info["tokenizer"]["kind"] == "dir"
    assert vocab["size"] == tok.vocab_size
    pieces = vocab["pieces"]
    assert "".join(pieces[i] for i in prompt) == PROMPT
    assert "".join(pieces[i] for i in answer) == ANSWER
    im_start, im_end = tok.token_id("<|im_start|>"), tok.token_id("<|im_end|>")
    assert pieces[im_start] == "<|im_start|>" and {im_start, im_end} <= set(vocab["special"])
    # The special ids are exactly the tokenizer's special tokens, no more.
    assert set(vocab["special"]) == set(tok.special.values())
    # The token window still carries the ids the pieces are looked up by.
    async with ViewServer(tmp_path / "run") as srv, aiohttp.ClientSession() as s:
        body = await get_json(s, f"{srv.url}/api/episodes/{ep.id}/traces/0/branches/1/tokens"
                                 "?format=json")
    assert body["ids"] == [*prompt, *answer]


@pytest.mark.parametrize("meta", [
    {"name": "plain"},
    {"name": "other model", "model": "gpt-oss-120b"},
    {"name": "missing dir", "tokenizer": "/nonexistent/tokenizer-dir"},
])
async def test_unknown_tokenizer_means_ids_only(tmp_path: Path, meta: dict[str, str]) -> None:
    await write_run(tmp_path / "run", [token_episode([1, 2], [3])], meta=meta)
    info, vocab = await vocab_of(tmp_path / "run")
    assert info["tokenizer"]["known"] is False and info["tokenizer"]["reason"]
    assert vocab["known"] is False and vocab["pieces"] == [] and vocab["size"] == 0


async def test_broken_tokenizer_directory_reports_why(tmp_path: Path) -> None:
    bad = tmp_path / "bad-tok"
    bad.mkdir()
    (bad / "tokenizer.json").write_text("{not json")
    await write_run(tmp_path / "run", [token_episode([1], [2])],
                    meta={"name": "bad", "tokenizer": str(bad)})
    _, vocab = await vocab_of(tmp_path / "run")
    assert vocab["known"] is False and "cannot load the tokenizer" in vocab["reason"]


async def test_top_level_meta_and_a_directory_relative_to_the_run(tmp_path: Path) -> None:
    # A tokenizer directory kept inside the run and named relative to it, recorded at the
    # top level of meta.json (as a writer other than Run.create's config might put it).
    run_dir = tmp_path / "run"
    tok_dir = build_tokenizer_dir(tmp_path / "elsewhere", "llama3")
    tok = ChatTokenizer(tok_dir)
    ids = tok.encode("<|begin_of_text|>hello")
    await write_run(run_dir, [token_episode(ids[:1], ids[1:])])
    (run_dir / "tok").symlink_to(tok_dir, target_is_directory=True)
    meta = orjson.loads((run_dir / "meta.json").read_bytes())
    (run_dir / "meta.json").write_bytes(orjson.dumps({**meta, "tokenizer": "tok"}))
    info, vocab = await vocab_of(run_dir)
    assert info["tokenizer"]["kind"] == "dir" and info["tokenizer"]["name"] == "tok"
    assert "".join(vocab["pieces"][i] for i in ids) == "<|begin_of_text|>hello"
    assert vocab["pieces"][ids[0]] == "<|begin_of_text|>" and ids[0] in vocab["special"]


# Browser tests stay last in the module: the module-scoped Playwright browser keeps an
# event loop on this thread from its first use on, which async tests after it would trip on.
@pytest.mark.browser
def test_token_view_shows_text(view_page: Any, tmp_path: Path, qwen_dir: Path) -> None:
    tok = ChatTokenizer(qwen_dir)
    prompt, answer = tok.encode(PROMPT), tok.encode(ANSWER)
    ep = token_episode(prompt, answer)
    meta = {"name": "text", "tokenizer": str(qwen_dir)}
    # In a thread of its own: Playwright's sync API keeps an event loop on the test thread.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, write_run(tmp_path / "run", [ep], meta=meta)).result()
    page = view_page
    with ViewServer.run_in_thread(tmp_path / "run") as srv:
        page.goto(f"{srv.url}/#/episodes/{ep.id}")
        page.get_by_test_id("tab-tokens").click()
        expect(page.get_by_test_id("token-tokenizer")).to_contain_text(str(qwen_dir))
        first = page.locator(".tok[data-pos='0']")
        expect(first).to_have_text("<|im_start|>")
        expect(first).to_have_class("tok k0 special")  # k0: a prompt token
        # "user\n" and friends: whitespace shown visibly, text joined back gives the prompt.
        n = len(prompt) + len(answer)
        cells = page.locator(".tok")
        expect(cells).to_have_count(n)
        shown = "".join(cells.nth(i).inner_text() for i in range(n))
        want = (PROMPT + ANSWER).replace(" ", "·").replace("\n", "↵")
        assert shown == want
        last = page.locator(f".tok[data-pos='{n - 1}']")
        last.hover()
        expect(page.get_by_test_id("token-info")).to_contain_text(
            f'id {tok.token_id("<|im_end|>")} · text "<|im_end|>" (special)')
        page.get_by_test_id("token-show").select_option("ids")
        expect(first).to_have_text(str(prompt[0]))
    assert page.errors == []


@pytest.mark.browser
def test_token_view_without_tokenizer_shows_ids(view_page: Any, tmp_path: Path) -> None:
    ep = token_episode([11, 12], [13])
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, write_run(tmp_path / "run", [ep])).result()
    page = view_page
    with ViewServer.run_in_thread(tmp_path / "run") as srv:
        page.goto(f"{srv.url}/#/episodes/{ep.id}")
        page.get_by_test_id("tab-tokens").click()
        expect(page.get_by_test_id("token-tokenizer")).to_have_text(
            "ids only (tokenizer unknown)")
        expect(page.locator(".tok[data-pos='2']")).to_have_text("13")
        expect(page.get_by_test_id("token-show")).to_have_count(0)
    assert page.errors == []
