"""The RL views' JSON API over a real socket: groups and advantages (a real train run), diffs
of rollouts built to part at a known token, run against run (two real eval runs), and the
token kinds / extra columns behind the heat map."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest

from tracewire.store import open_run
from tracewire.tito import ChatTokenizer, probe_family
from tracewire.tito.fixtures import build_tokenizer_dir
from tracewire.trace import Episode, Message
from tracewire.view import ViewServer

from .builders import write_run
from .rl_builders import (
    PROMPT_IDS,
    TRAIN_STEPS,
    diff_pair,
    expected_compare,
    expected_groups,
    make_eval_runs,
    make_train_run,
    rollout,
    write_pairs,
)
from .test_api import get_json


@pytest.fixture(scope="module")
def train_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_train_run(tmp_path_factory.mktemp("rltrain") / "train")


@pytest.fixture(scope="module")
def eval_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("rleval")
    return make_eval_runs(base / "eval-a", base / "eval-b")


async def test_groups_of_a_train_run_with_the_trainers_advantages(train_run: Path) -> None:
    want = expected_groups(train_run)
    assert len(want) == TRAIN_STEPS * 2  # one group per task and step
    async with ViewServer(train_run) as srv, aiohttp.ClientSession() as s:
        page = await get_json(s, srv.url + "/api/groups?limit=500")
        assert page["groups"] == page["total"] == len(want)
        assert {r["group"] for r in page["rows"]} == set(want)
        mixed = {k for k, g in want.items() if len(set(g["reward"].values())) > 1}
        assert page["mixed"] == len(mixed) and page["equal"] == len(want) - len(mixed)
        for row in page["rows"]:
            rewards = list(want[row["group"]]["reward"].values())
            assert row["n"] == len(rewards) == 3
            assert row["mean"] == pytest.approx(float(np.mean(rewards)))
            assert row["spread"] == pytest.approx(max(rewards) - min(rewards))
            assert row["step_min"] == row["step_max"]
        for spread, keys in (("mixed", mixed), ("equal", set(want) - mixed)):
            got = await get_json(s, f"{srv.url}/api/groups?spread={spread}&limit=500")
            assert {r["group"] for r in got["rows"]} == keys
        got = await get_json(s, srv.url + "/api/groups?step_min=1&step_max=1")
        assert got["total"] == 2 and all(r["step_min"] == 1 for r in got["rows"])

        for key, g in want.items():
            # A train group id holds slashes: the URL carries it encoded.
            body = await get_json(s, f"{srv.url}/api/groups/{key.replace('/', '%2F')}")
            assert body["group"] == key and body["reward_names"] == ["correct"]
            ids = [r["id"] for r in body["rollouts"]]
            assert set(ids) == set(g["reward"])
            rewards = [r["reward"] for r in body["rollouts"]]
            assert rewards == sorted(rewards, reverse=True)
            for r in body["rollouts"]:
                assert r["reward"] == g["reward"][r["id"]]
                assert r["advantage"] == pytest.approx(g["advantage"][r["id"]], abs=1e-9)
                assert r["rewards"] == g["parts"][r["id"]]
                assert r["step"] is not None and r["policy_version"] is not None
        ordered = [r["group"] for r in page["rows"]]
        mid = await get_json(s, f"{srv.url}/api/groups/{ordered[1].replace('/', '%2F')}")
        assert mid["prev"] == ordered[0] and mid["next"] == ordered[2]
        await get_json(s, srv.url + "/api/groups/nope", 404)
        await get_json(s, srv.url + "/api/groups?spread=some", 400)
        await get_json(s, srv.url + "/api/groups?limit=100000", 400)


async def test_group_of_episodes_without_a_group_id_is_their_task(tmp_path: Path) -> None:
    eps = [rollout([[5, 6]], group=None, task="solo é/1", index=i, reward=float(i))
           for i in range(3)]
    await write_pairs(tmp_path / "run", eps)
    async with ViewServer(tmp_path / "run") as srv, aiohttp.ClientSession() as s:
        body = await get_json(s, srv.url + "/api/groups/task:solo%20%C3%A9%2F1")
        await get_json(s, srv.url + "/api/groups/" + "x" * 600, 404)
    assert [r["reward"] for r in body["rollouts"]] == [2.0, 1.0, 0.0]
    sd = float(np.std([0.0, 1.0, 2.0]))
    assert [r["advantage"] for r in body["rollouts"]] == pytest.approx(
        [(x - 1.0) / (sd + 1e-6) for x in (2.0, 1.0, 0.0)])


@pytest.mark.parametrize(("turns", "at_turn", "at_token"), [(1, 0, 0), (3, 1, 7), (4, 3, 11)])
async def test_diff_points_at_the_first_differing_token(tmp_path: Path, turns: int,
                                                        at_turn: int, at_token: int) -> None:
    a, b = diff_pair(turns, at_turn, at_token)
    same = rollout([[100 + 13 * t + k for k in range(12)] for t in range(turns)], index=2,
                   texts=[f"answer {t}" for t in range(turns)])
    await write_pairs(tmp_path / "run", [a, b, same])
    async with ViewServer(tmp_path / "run") as srv, aiohttp.ClientSession() as s:
        d = await get_json(s, f"{srv.url}/api/diff?a={a.id}&b={b.id}")
        ident = await get_json(s, f"{srv.url}/api/diff?a={a.id}&b={same.id}")
        await get_json(s, f"{srv.url}/api/diff?a={a.id}", 400)
        await get_json(s, f"{srv.url}/api/diff?a={a.id}&b=nosuch", 404)
        await get_json(s, f"{srv.url}/api/diff?a={a.id}&b={b.id}&ta=3", 404)
    msg = 2 + 2 * at_turn  # system, user, then (answer, tool) per turn
    pos = 3 + len(PROMPT_IDS) + at_turn * (12 + 2) + at_token
    assert d["same_task"] and not d["identical"]
    assert d["first_message"] == msg and d["shared"] == msg
    assert [m["message"]["role"] for m in d["shared_messages"]][:2] == ["system", "user"]
    assert len(d["shared_messages"]) == msg
    tok = d["token"]
    assert (tok["message"], tok["offset"], tok["pos_a"], tok["pos_b"]) == (msg, at_token, pos, pos)
    ids_a = a.traces[0].branch(len(a.traces[0].nodes) - 1).ids
    ids_b = b.traces[0].branch(len(b.traces[0].nodes) - 1).ids
    for side, ids in (("a", ids_a), ("b", ids_b)):
        w = tok[side]
        assert w["ids"] == ids[w["start"] : w["end"]].tolist()
        assert w["start"] <= pos < w["end"]
    k = pos - tok["a"]["start"]
    assert tok["a"]["ids"][k] + 1 == tok["b"]["ids"][k]
    assert tok["a"]["logprobs"][k] == pytest.approx(-0.01 * (at_token + 1))
    assert tok["a"]["ids"][:k] == tok["b"]["ids"][:k]
    assert d["rest_a"][0]["index"] == msg
    assert d["rest_b"][0]["message"]["content"].endswith("(other)")
    assert ident["identical"] and ident["token"] is None and ident["first_message"] is None


async def test_same_text_sampled_as_other_ids_is_found_by_token(tmp_path: Path) -> None:
    a = rollout([[7, 8, 9]], texts=["hi"])
    b = rollout([[7, 8, 10]], texts=["hi"], index=1)
    await write_pairs(tmp_path / "run", [a, b])
    async with ViewServer(tmp_path / "run") as srv, aiohttp.ClientSession() as s:
        d = await get_json(s, f"{srv.url}/api/diff?a={a.id}&b={b.id}")
    assert d["first_message"] is None and d["token"]["offset"] == 2 and not d["identical"]


async def test_compare_two_eval_runs_per_task(eval_runs: tuple[Path, Path]) -> None:
    a, b = eval_runs
    want = expected_compare(a, b)
    assert len(want) == 4
    async with ViewServer(a, compare=[b]) as srv, aiohttp.ClientSession() as s:
        runs = await get_json(s, srv.url + "/api/runs")
        assert runs["default"] == b.name and [r["name"] for r in runs["runs"]] == [a.name, b.name]
        d = await get_json(s, srv.url + "/api/compare")
        assert d["a"]["run"] == a.name and d["b"]["run"] == b.name
        assert {r["task_key"]: r["diff"] for r in d["rows"]} == pytest.approx(want)
        diffs = [r["diff"] for r in d["rows"]]
        assert diffs == sorted(diffs)  # worse first
        assert d["worse"] == sum(1 for v in want.values() if v < -1e-9)
        assert d["better"] == sum(1 for v in want.values() if v > 1e-9)
        # Each row names A's best and B's worst rollout of its task, for a diff across runs.
        ra, rb = open_run(a).rows(), open_run(b).rows()
        for r in d["rows"]:
            mine_a = [x.reward for x in ra if x.task_key == r["task_key"]]
            mine_b = [x.reward for x in rb if x.task_key == r["task_key"]]
            assert next(x.reward for x in ra if x.episode_id == r["a_id"]) == max(mine_a)
            assert next(x.reward for x in rb if x.episode_id == r["b_id"]) == min(mine_b)
        r0 = d["rows"][0]
        cross = await get_json(s, f"{srv.url}/api/diff?a={r0['a_id']}&b={r0['b_id']}"
                                  f"&b_run={b.name}")
        assert cross["same_task"] and cross["b"]["id"] == r0["b_id"]
        assert [m["message"]["role"] for m in cross["shared_messages"]][:2] == ["system", "user"]
        await get_json(s, f"{srv.url}/api/diff?a={r0['a_id']}&b={r0['b_id']}", 404)
        await get_json(s, f"{srv.url}/api/diff?a={r0['a_id']}&b={r0['b_id']}&b_run=zz", 404)
        desc = await get_json(s, srv.url + "/api/compare?sort=diff&order=desc")
        assert [r["diff"] for r in desc["rows"]] == sorted(diffs, reverse=True)
        by_task = await get_json(s, srv.url + "/api/compare?sort=task_key")
        assert [r["task_key"] for r in by_task["rows"]] == sorted(want)
        await get_json(s, srv.url + "/api/compare?b=../etc", 404)
        await get_json(s, srv.url + "/api/compare?sort=zzz", 400)
    # A sibling directory is offered without naming it on the command line.
    async with ViewServer(a) as srv, aiohttp.ClientSession() as s:
        runs = await get_json(s, srv.url + "/api/runs")
        assert b.name in [r["name"] for r in runs["runs"]] and runs["default"] is None
        d = await get_json(s, f"{srv.url}/api/compare?b={b.name}")
        assert {r["task_key"]: r["diff"] for r in d["rows"]} == pytest.approx(want)


async def test_compare_step_ranges_of_one_train_run(train_run: Path) -> None:
    rows = open_run(train_run).rows()

    def means(step: int) -> dict[str, float]:
        got: dict[str, list[float]] = {}
        for r in rows:
            if r.step == step:
                got.setdefault(r.task_key, []).append(r.reward)
        return {k: sum(v) / len(v) for k, v in got.items()}

    m0, m2 = means(0), means(2)
    async with ViewServer(train_run) as srv, aiohttp.ClientSession() as s:
        d = await get_json(s, srv.url + "/api/compare?a_step_max=0&b_step_min=2&b_step_max=2")
    assert d["a"]["episodes"] == 6 and d["b"]["episodes"] == 6
    for r in d["rows"]:
        a_mean, b_mean = m0.get(r["task_key"]), m2.get(r["task_key"])
        assert r["a"] == (pytest.approx(a_mean) if a_mean is not None else None)
        assert r["b"] == (pytest.approx(b_mean) if b_mean is not None else None)
        if a_mean is not None and b_mean is not None:
            assert r["diff"] == pytest.approx(b_mean - a_mean)
        else:
            assert r["diff"] is None


def chatml_episode(tok: ChatTokenizer) -> tuple[Episode, dict[str, Any]]:
    """A user turn, an answer ending in ``<|im_end|>``, a tool result whose ids start with the
    template's junction, and a second answer cut by length followed by a synthesized close."""
    fam = probe_family(tok)
    close = tok.token_id(fam.close)
    assert close is not None and fam.junction == "\n"
    junction = tok.encode(fam.junction)
    ep = Episode(env="tok", task_key="junction")
    tr = ep.new_trace()
    u = tr.add_node(Message(role="user", content="hi"),
                    ids=tok.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"))
    ans = [*tok.encode("Sure."), close]
    a = tr.add_node(Message(role="assistant", content="Sure."), parent=u, sampled=True, ids=ans,
                    logprobs=np.linspace(-3, 0, len(ans), dtype=np.float32),
                    extra={"entropy": np.linspace(0, 2, len(ans), dtype=np.float32)})
    tool = [*junction, *tok.encode("<|im_start|>tool\n4<|im_end|>\n<|im_start|>assistant\n")]
    t = tr.add_node(Message(role="tool", content="4", tool_call_id="c"), parent=a, ids=tool,
                    extra={"entropy": np.zeros(len(tool), dtype=np.float32)})
    cut = tok.encode("It is")
    b = tr.add_node(Message(role="assistant", content="It is"), parent=t, sampled=True, ids=cut,
                    mask=0, logprobs=np.full(len(cut), -0.1, dtype=np.float32),
                    extra={"entropy": np.ones(len(cut), dtype=np.float32)})
    after = [close, *junction, *tok.encode("<|im_start|>user\nok")]
    tr.add_node(Message(role="user", content="ok"), parent=b, ids=after,
                extra={"entropy": np.zeros(len(after), dtype=np.float32)})
    return ep, {"prompt": tr.nodes[u].end, "answer": len(ans), "junction": len(junction),
                "tool": len(tool), "cut": len(cut), "after": len(after)}


async def test_token_kinds_mark_junctions_and_masked_samples(tmp_path: Path) -> None:
    qwen = build_tokenizer_dir(tmp_path / "qwen25", "qwen25")
    tok = ChatTokenizer(qwen)
    ep, n = chatml_episode(tok)
    await write_run(tmp_path / "run", [ep], meta={"name": "kinds", "tokenizer": str(qwen)})
    leaf = len(ep.traces[0].nodes) - 1
    async with ViewServer(tmp_path / "run") as srv, aiohttp.ClientSession() as s:
        url = f"{srv.url}/api/episodes/{ep.id}/traces/0/branches/{leaf}/tokens"
        body = await get_json(s, url + "?format=json&kinds=1&extra=entropy")
        async with s.get(url + "?format=bin&kinds=1&extra=entropy") as r:
            raw = await r.read()
            lo, hi = float(r.headers["X-Extra-Min"]), float(r.headers["X-Extra-Max"])
        summary = await get_json(s, f"{srv.url}/api/episodes/{ep.id}")
        await get_json(s, url + "?extra=nosuch", 404)
    want = ([0] * n["prompt"] + [1] * n["answer"] + [3] * n["junction"]
            + [0] * (n["tool"] - n["junction"]) + [2] * n["cut"] + [3] * (1 + n["junction"])
            + [0] * (n["after"] - 1 - n["junction"]))
    assert body["kind"] == want
    total = len(want)
    assert np.array_equal(np.frombuffer(raw[9 * total : 10 * total], "u1"), want)
    entropy = np.frombuffer(raw[10 * total :], "<f4")
    assert np.array_equal(entropy, ep.traces[0].columns.column("entropy"))
    assert (lo, hi) == (0.0, 2.0)
    assert summary["traces"][0]["extra"] == ["entropy"]
    assert math.isclose(body["logprobs"][n["prompt"]], -3.0)


async def test_cli_view_of_two_runs_offers_the_second(eval_runs: tuple[Path, Path]) -> None:
    import asyncio
    import sys

    a, b = eval_runs
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tracewire", "view", str(a), str(b), "--port", "0",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        url = line.rsplit(" at ", 1)[1].strip()
        async with aiohttp.ClientSession() as s:
            runs = await get_json(s, url + "/api/runs")
            d = await get_json(s, url + "/api/compare")
        assert runs["default"] == b.name and d["b"]["run"] == b.name
        assert {r["task_key"]: r["diff"] for r in d["rows"]} == pytest.approx(
            expected_compare(a, b))
    finally:
        proc.terminate()
        await proc.wait()


async def test_gguf_tokenizer_gives_text_and_junctions(tmp_path: Path) -> None:
    from tracewire.tito.fixtures import build_gguf_file

    path = build_gguf_file(tmp_path / "qwen25.gguf", "qwen25")
    tok = ChatTokenizer(path)
    ep, n = chatml_episode(tok)
    await write_run(tmp_path / "run", [ep], meta={"name": "gguf", "tokenizer": str(path)})
    leaf = len(ep.traces[0].nodes) - 1
    async with ViewServer(tmp_path / "run") as srv, aiohttp.ClientSession() as s:
        info = await get_json(s, srv.url + "/api/run")
        vocab = await get_json(s, srv.url + "/api/vocab")
        body = await get_json(s, f"{srv.url}/api/episodes/{ep.id}/traces/0/branches/{leaf}"
                                 "/tokens?format=json&kinds=1")
    assert info["tokenizer"]["known"] and vocab["size"] == tok.vocab_size
    ids = ep.traces[0].columns.ids.tolist()
    assert "".join(vocab["pieces"][i] for i in ids) == tok.decode(ids)
    junction_at = n["prompt"] + n["answer"]
    assert body["kind"][junction_at : junction_at + n["junction"]] == [3] * n["junction"]
    assert body["kind"].count(3) == 2 * n["junction"] + 1
