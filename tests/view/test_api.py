"""JSON API of the viewer over a real socket, on runs written by the store."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from tracewire.trace import Episode
from tracewire.view import ViewServer, build_app

from .builders import fixture_episodes, write_run


@pytest.fixture
async def fixture_run(tmp_path: Path) -> tuple[Path, dict[str, Episode]]:
    eps = fixture_episodes()
    await write_run(tmp_path / "run", eps)
    return tmp_path / "run", {ep.id: ep for ep in eps}


@pytest.fixture
async def client(fixture_run: tuple[Path, dict[str, Episode]]
                 ) -> AsyncIterator[tuple[aiohttp.ClientSession, str, dict[str, Episode]]]:
    path, eps = fixture_run
    async with ViewServer(path) as server, aiohttp.ClientSession() as session:
        yield session, server.url, eps


Client = tuple[aiohttp.ClientSession, str, dict[str, Episode]]


async def get_json(s: aiohttp.ClientSession, url: str, status: int = 200) -> dict:  # type: ignore[type-arg]
    async with s.get(url) as r:
        assert r.status == status, await r.text()
        assert r.content_type == "application/json"
        return await r.json()  # type: ignore[no-any-return]


async def test_page_and_assets(client: Client) -> None:
    s, url, _ = client
    async with s.get(url + "/") as r:
        assert r.status == 200
        html = await r.text()
    assert '<script type="module" src="/static/app.js">' in html
    for name in ("app.js", "episode.js", "tokens.js", "plots.js", "runpage.js", "util.js",
                 "style.css"):
        async with s.get(f"{url}/static/{name}") as r:
            assert r.status == 200, name
    # No network at run time: nothing on the page loads from elsewhere.
    assert "http" not in html.replace('http-equiv', '')


async def test_traversal_and_unknown_ids_are_404(client: Client) -> None:
    s, url, _ = client
    for path in ("/static/../_app.py", "/static/..%2f_app.py", "/static/%2e%2e/__init__.py",
                 "/static/nope.js", "/api/episodes/..%2f..%2fmeta.json",
                 "/api/episodes/does-not-exist", "/api/episodes/a.b",
                 "/../../etc/passwd", "/static/..%2F..%2F..%2Fetc%2Fpasswd"):
        async with s.get(url + path) as r:
            assert r.status == 404, path
            assert "root:" not in await r.text()


async def test_run_info(client: Client) -> None:
    s, url, eps = client
    info = await get_json(s, url + "/api/run")
    assert info["dir"] == "run"
    assert info["episodes"] == len(eps)
    assert info["meta"]["status"] == "complete"


async def test_index_sort_filter_paginate(client: Client) -> None:
    s, url, eps = client
    page = await get_json(s, url + "/api/episodes?limit=10")
    assert page["total"] == 31 and len(page["rows"]) == 10
    assert [r["arrival"] for r in page["rows"]] == sorted(r["arrival"] for r in page["rows"])
    ids = [r["id"] for r in page["rows"]]
    assert ids == list(eps)[:10]

    page = await get_json(s, url + "/api/episodes?sort=reward&order=desc&limit=500")
    rewards = [r["reward"] for r in page["rows"]]
    assert rewards == sorted(rewards, reverse=True)
    assert rewards[0] == max(e.reward for e in eps.values())

    page = await get_json(s, url + "/api/episodes?env=tools&errors=false&limit=500")
    want = [e.id for e in eps.values() if e.env == "tools" and not any(
        t.errors for t in e.traces)]
    assert [r["id"] for r in page["rows"]] == want and page["total"] == len(want)

    page = await get_json(s, url + "/api/episodes?reward_min=0.5&reward_max=0.8&limit=500")
    assert page["rows"] and all(0.5 <= r["reward"] <= 0.8 for r in page["rows"])
    assert page["total"] == sum(0.5 <= e.reward <= 0.8 for e in eps.values())

    page = await get_json(s, url + "/api/episodes?q=TASK-01&stop=done")
    assert {r["task_key"] for r in page["rows"]} <= {f"task-{i:03d}" for i in range(10, 20)}
    assert page["total"] == sum(
        e.task_key.startswith("task-01") and e.traces[0].stop == "done" for e in eps.values())

    # Pages tile the ordering with no gap or repeat.
    seen: list[str] = []
    for off in range(0, 31, 7):
        page = await get_json(s, f"{url}/api/episodes?sort=env&limit=7&offset={off}")
        seen += [r["id"] for r in page["rows"]]
    assert sorted(seen) == sorted(eps)


async def test_bad_params_are_400_json_and_server_keeps_serving(client: Client) -> None:
    s, url, _ = client
    for q in ("limit=0", "limit=100000", "limit=x", "offset=-1", "sort=secret", "order=up",
              "reward_min=abc", "reward_max=nan", "errors=maybe", "q=" + "x" * 500):
        body = await get_json(s, f"{url}/api/episodes?{q}", status=400)
        assert body["error"]
    body = await get_json(s, url + "/api/stats?bins=0", status=400)
    assert "bins" in body["error"]
    assert (await get_json(s, url + "/api/episodes"))["total"] == 31


async def test_facets_and_stats(client: Client) -> None:
    s, url, eps = client
    facets = await get_json(s, url + "/api/facets")
    assert facets["env"] == ["arith", "guess", "tools"]
    assert set(facets["stop"]) == {"done", "max_turns"}
    stats = await get_json(s, url + "/api/stats?bins=5")
    assert stats["n"] == 31 and sum(stats["hist"]["counts"]) == 31
    assert len(stats["hist"]["edges"]) == 6
    assert stats["mean"] == pytest.approx(np.mean([e.reward for e in eps.values()]))
    assert sum(stats["over_time"]["n"]) == 31


async def test_episode_branch_timing_tokens(client: Client) -> None:
    s, url, eps = client
    ep = next(iter(eps.values()))
    tr = ep.traces[0]
    summary = await get_json(s, f"{url}/api/episodes/{ep.id}")
    assert summary["live"] is False and summary["task_key"] == ep.task_key
    t0 = summary["traces"][0]
    assert t0["n_nodes"] == 5 and t0["n_tokens"] == len(tr.columns)
    assert t0["rewards"]["correct"]["score"] == ep.reward
    assert t0["leaves"] == [{"leaf": 4, "depth": 5, "n_tokens": len(tr.columns),
                             "role": "assistant"}]

    page = await get_json(s, f"{url}/api/episodes/{ep.id}/traces/0/branches/4")
    roles = [n["message"]["role"] for n in page["nodes"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    assert page["nodes"][2]["message"]["tool_calls"][0]["name"] == "add"
    assert page["nodes"][2]["call"]["finish_reason"] == "tool_calls"
    assert page["nodes"][3]["message"]["tool_call_id"] == "call_0"
    assert page["nodes"][-1]["end"] == len(tr.columns)

    timing = await get_json(s, f"{url}/api/episodes/{ep.id}/traces/0/timing")
    assert {p["name"] for p in timing["phases"]} == {"setup", "scoring", "agent"}
    assert timing["calls"]["finish"] == ["tool_calls", "stop"]
    assert timing["calls"]["node"] == [2, 4]

    async with s.get(f"{url}/api/episodes/{ep.id}/traces/0/branches/4/tokens?start=2&end=9"
                     ) as r:
        assert r.status == 200 and r.content_type == "application/octet-stream"
        assert r.headers["X-Token-Total"] == str(len(tr.columns))
        raw = await r.read()
    n = 7
    assert np.array_equal(np.frombuffer(raw[: 4 * n], "<i4"), tr.columns.ids[2:9])
    assert np.array_equal(np.frombuffer(raw[4 * n : 8 * n], "<f4"), tr.columns.logprobs[2:9],
                          equal_nan=True)
    assert np.array_equal(np.frombuffer(raw[8 * n :], "u1"), tr.columns.mask[2:9])
    body = await get_json(s, f"{url}/api/episodes/{ep.id}/traces/0/branches/4/tokens"
                             "?start=0&end=100&format=json")
    assert body["end"] == len(tr.columns) and body["ids"] == tr.columns.ids.tolist()
    assert body["logprobs"][0] is None  # NaN (not sampled) travels as null

    for bad in ("start=5&end=2", "start=0&end=70000", "start=x", "format=xml"):
        await get_json(s, f"{url}/api/episodes/{ep.id}/traces/0/branches/4/tokens?{bad}", 400)
    for path in ("traces/1/timing", "traces/x/timing", "traces/0/branches/5",
                 "traces/0/branches/-1/tokens", "traces/0/branches/99/tokens"):
        await get_json(s, f"{url}/api/episodes/{ep.id}/{path}", 404)


async def test_branches_of_a_tree(client: Client) -> None:
    s, url, eps = client
    ep = next(e for e in eps.values() if e.task_key == "branchy")
    tr = ep.traces[0]
    summary = await get_json(s, f"{url}/api/episodes/{ep.id}")
    leaves = summary["traces"][0]["leaves"]
    assert [lf["leaf"] for lf in leaves] == tr.leaves() == [4, 6]
    for leaf in (4, 6):
        page = await get_json(s, f"{url}/api/episodes/{ep.id}/traces/0/branches/{leaf}")
        assert [n["index"] for n in page["nodes"]] == tr.path(leaf)
        body = await get_json(s, f"{url}/api/episodes/{ep.id}/traces/0/branches/{leaf}/tokens"
                                 "?format=json")
        assert body["ids"] == tr.branch(leaf).ids.tolist()  # non-contiguous: concatenated


async def test_build_app_rejects_a_non_run(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        build_app(tmp_path / "missing")


async def test_non_get_is_405_with_allow_header(client: Client) -> None:
    s, url, _ = client
    for method, path in (("POST", "/api/run"), ("DELETE", "/api/episodes"), ("PUT", "/"),
                         ("PATCH", "/api/facets")):
        async with s.request(method, url + path) as r:
            assert r.status == 405, (method, path, r.status, await r.text())
            assert "GET" in r.headers.get("Allow", ""), dict(r.headers)
            assert r.content_type == "application/json"
            assert "error" in await r.json()
    await get_json(s, url + "/api/run")  # still serving
