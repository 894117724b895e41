"""The session API's sample collector on its own: no HTTP, a real ``Session`` and ``Trace``
recorded by hand, payloads decoded with the real codec."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tracewire import LimitError
from tracewire.proxy import SampleCollector
from tracewire.proxy._session import Session
from tracewire.samples import assemble, decode_samples, payload_meta

from ..samples.builders import complete, golden, prompt


def _session() -> Session:
    s = Session(proxy_url="http://127.0.0.1:1", metadata={"task": "t"}, group_id="g",
                group_index=1)
    golden(s.trace)
    return s


def _bytes(parts: list[bytes | memoryview]) -> bytes:
    return b"".join(bytes(p) for p in parts)


def test_the_collector_module_imports_no_http() -> None:
    path = Path(__file__).parents[2] / "src/tracewire/proxy/_collector.py"
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.add("." * node.level + (node.module or ""))
    assert names, "no imports found: the walk is broken"
    assert not {n for n in names if n.split(".")[0] in ("aiohttp", "yarl", "multidict")}
    assert "._http" not in names and "._session_api" not in names


async def test_collect_is_cached_until_the_trace_or_hooks_change() -> None:
    c = SampleCollector()
    s = _session()
    one = await c.collect(s, 8, {"step": 3})
    assert await c.collect(s, 8, {"step": 3}) is one  # the kept buffers, not a rebuild
    got = decode_samples(_bytes(one))
    want = assemble(s.trace, max_seq_len=8, metadata={"task": "t"},
                    computed={"session_id": s.id}, overrides={"step": 3}, group_id="g",
                    group_index=1)
    assert len(got) == len(want) and all(a.equals(b) for a, b in zip(got, want, strict=True))
    info = payload_meta(_bytes(one))["info"]
    assert info["session_id"] == s.id and info["trace_id"] == s.trace.id
    assert info["max_seq_len"] == 8 and info["turns"] == 2

    other = await c.collect(s, None, {"step": 3})  # another request: assembled afresh
    assert other is not one and decode_samples(_bytes(other))[0].tokens.shape[0] == 9
    c.picker = None  # another hook: afresh too
    assert await c.collect(s, None, {"step": 3}) is not other
    leaf = len(s.trace.nodes) - 1
    p = prompt(s.trace, leaf, [("user", "more")], [40])
    complete(s.trace, p, [41], [-1.0], "stop")
    longer = await c.collect(s, None, {"step": 3})
    assert decode_samples(_bytes(longer))[0].tokens.tolist()[-2:] == [40, 41]


async def test_closed_sessions_keep_their_payload_for_the_grace_period() -> None:
    c = SampleCollector(grace_s=10.0)
    s = _session()
    parts = await c.collect(s, None, {})
    key = c.request_key(None, {})
    assert c.kept(s.id, c.request_key(5, {})) is None  # a different request is not kept
    c.closed(s.id, now=100.0)
    assert s.id not in c.builders and c.has_collected(s.id)
    assert c.kept(s.id, key, now=109.0) is parts
    assert c.kept(s.id, key, now=111.0) is None
    c.sweep(live=set(), now=105.0)
    assert c.has_collected(s.id)  # within grace
    c.sweep(live=set(), now=111.0)
    assert not c.has_collected(s.id)


async def test_sweep_forgets_sessions_that_are_not_live() -> None:
    c = SampleCollector(grace_s=10.0)
    gone, alive = _session(), _session()
    await c.collect(gone, None, {})
    await c.collect(alive, None, {})
    c.sweep(live={alive.id}, now=50.0)
    assert set(c.builders) == {alive.id}
    assert c.collected[gone.id].closed_at == 50.0 and c.collected[alive.id].closed_at is None
    c.sweep(live={alive.id}, now=61.0)
    assert set(c.collected) == {alive.id}
    c.close()
    assert c.builders == {}


async def test_payload_cap_is_a_limit_error() -> None:
    c = SampleCollector(max_payload_bytes=10)
    s = _session()
    with pytest.raises(LimitError, match="max_payload_bytes=10"):
        await c.collect(s, None, {})
    assert not c.has_collected(s.id)
    assert len(decode_samples(_bytes(await c.collect(s, 1, {})))) == 1  # 9 bytes fit
