"""The proxy's HTTP session API and its client, with traces recorded by hand (no upstream
needed). The trainer token comes from TRACEWIRE_SESSION_TOKEN, set for every test here."""

from __future__ import annotations

import asyncio
import importlib.util
import io
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import numpy as np
import orjson
import pytest
import safetensors.numpy as stn

from tracewire import HookError, LimitError, ProxyError, SessionError, Trace
from tracewire.proxy import Proxy, ProxyConfig, SessionAPI, add_session_routes
from tracewire.samples import Sample, assemble, decode_samples, payload_meta
from tracewire.sessions import TOKEN_ENV, GoneReason, SessionClient, SyncSessionClient

from .builders import complete, golden, prompt

DEAD_UPSTREAM = "http://127.0.0.1:9/v1"  # the session API never calls the upstream
TOKEN = "tws-test-token"


@pytest.fixture(autouse=True)
def _token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, TOKEN)


@pytest.fixture
async def proxy() -> AsyncIterator[Proxy]:
    async with Proxy(DEAD_UPSTREAM, config=ProxyConfig(max_sessions=4)) as p:
        yield p


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30),
                                     headers={"Authorization": f"Bearer {TOKEN}"}) as s:
        yield s


def api_of(proxy: Proxy) -> SessionAPI:
    return add_session_routes(proxy.app, proxy)  # returns the mounted one


async def post(
    http: aiohttp.ClientSession, url: str, body: Any = None, raw: bytes | None = None
) -> tuple[int, bytes]:
    data: Any = raw if raw is not None else (None if body is None else orjson.dumps(body))
    if data is not None and len(data) > 1 << 19:
        data = io.BytesIO(data)  # aiohttp warns about big raw bodies
    async with http.post(url, data=data, headers={"Content-Type": "application/json"}) as r:
        return r.status, await r.read()


async def create(http: aiohttp.ClientSession, proxy: Proxy, **body: Any) -> str:
    status, data = await post(http, proxy.url + "/sessions", body)
    assert status == 201, data
    d = orjson.loads(data)
    assert d["base_url"] == f"{proxy.url}/sessions/{d['session_id']}/v1"
    assert d["api_key"].startswith("tw-")
    return str(d["session_id"])


def err(data: bytes) -> str:
    d = orjson.loads(data)
    assert {"error", "type", "message"} <= set(d) <= {"error", "type", "message", "reason"}
    assert isinstance(d["error"], str) and d["error"] == d["message"]
    return str(d["error"])


def same(a: list[Sample], b: list[Sample]) -> bool:
    return len(a) == len(b) and all(x.equals(y) for x, y in zip(a, b, strict=True))


async def test_lifecycle_collect_delete_grace(proxy: Proxy, http: aiohttp.ClientSession) -> None:
    sid = await create(http, proxy, metadata={"task": "t"}, group_id="g", group_index=1)
    session = proxy.registry.get(sid)
    golden(session.trace)  # the turns arrive while the session (and its builder) are live
    async with http.get(f"{proxy.url}/sessions/{sid}") as r:
        assert r.status == 200
        summary = await r.json()
    assert (summary["turns"], summary["tokens"], summary["branches"]) == (2, 9, 1)
    assert summary["status"] == "active" and summary["group_id"] == "g"

    url = f"{proxy.url}/sessions/{sid}/samples"
    status, payload = await post(http, url, {"max_seq_len": 8, "metadata": {"step": 3}})
    assert status == 200
    loaded = stn.load(payload)
    assert loaded["tokens.0"].tolist() == [1, 2, 3, 10, 11, 20, 21, 30]
    assert loaded["loss_mask.0"][3:].tolist() == [1, 1, 0, 0, 1]
    want = assemble(
        session.trace,
        max_seq_len=8,
        metadata={"task": "t"},
        computed={"session_id": sid},
        overrides={"step": 3},
        group_id="g",
        group_index=1,
    )
    assert same(decode_samples(payload), want)
    meta = payload_meta(payload)
    assert meta["info"]["session_id"] == sid and meta["info"]["dropped_leaves"] == []
    assert meta["samples"][0]["status"] == "truncated"

    # Repeating the call gives the same payload; so does repeating it after DELETE.
    assert await post(http, url, {"max_seq_len": 8, "metadata": {"step": 3}}) == (200, payload)
    async with http.delete(f"{proxy.url}/sessions/{sid}") as r:
        assert r.status == 200 and (await r.json())["already"] is None
    assert await post(http, url, {"max_seq_len": 8, "metadata": {"step": 3}}) == (200, payload)
    # A different collect after DELETE is a 404 that says why.
    status, data = await post(http, url, {})
    assert status == 404 and "deleted" in err(data)
    async with http.get(f"{proxy.url}/sessions/{sid}") as r:
        assert r.status == 404 and "deleted" in err(await r.read())
    async with http.delete(f"{proxy.url}/sessions/{sid}") as r:  # a retried DELETE is fine
        assert r.status == 200 and "deleted" in (await r.json())["already"]
    # Past the grace period the payload is gone too.
    api = api_of(proxy)
    api.sweep(now=api.collector.collected[sid].closed_at + api.grace_s + 1)  # type: ignore[operator]
    status, data = await post(http, url, {"max_seq_len": 8, "metadata": {"step": 3}})
    assert status == 404 and "deleted" in err(data)


async def test_unknown_and_expired_sessions(proxy: Proxy, http: aiohttp.ClientSession) -> None:
    for method, path in (
        ("GET", "/sessions/nope"),
        ("POST", "/sessions/nope/samples"),
        ("DELETE", "/sessions/nope"),
    ):
        async with http.request(method, proxy.url + path,
                                headers={"Content-Type": "application/json"}) as r:
            data = await r.read()
            assert r.status == 404 and "never existed" in err(data)
            assert orjson.loads(data)["reason"] == "never_existed"
    sid = await create(http, proxy, ttl=60)
    proxy.registry.get(sid).last_used -= 120  # idle past its TTL
    status, data = await post(http, f"{proxy.url}/sessions/{sid}/samples", {})
    assert status == 404 and "expired" in err(data)
    assert orjson.loads(data) | {"error": ""} == {
        "error": "", "type": "SessionError", "message": err(data), "reason": "expired"}


async def test_collect_tracks_new_turns(proxy: Proxy, http: aiohttp.ClientSession) -> None:
    sid = await create(http, proxy)
    t = proxy.registry.get(sid).trace
    url = f"{proxy.url}/sessions/{sid}/samples"
    status, empty = await post(http, url)
    assert status == 200 and payload_meta(empty)["empty_reason"] == "no_records"
    p = prompt(t, None, [("user", "u")], [1, 2])
    c = complete(t, p, [3], [-1.0], "tool_calls", tool=True)
    status, one = await post(http, url)
    assert decode_samples(one)[0].tokens.tolist() == [1, 2, 3]
    p = prompt(t, c, [("tool", "r")], [4])
    complete(t, p, [5], [-2.0], "stop")
    status, two = await post(http, url)
    assert decode_samples(two)[0].tokens.tolist() == [1, 2, 3, 4, 5]
    status, data = await post(http, url, {"max_seq_len": 3})
    assert decode_samples(data)[0].status == "truncated"


async def test_metadata_precedence_over_http(proxy: Proxy, http: aiohttp.ClientSession) -> None:
    sid = await create(http, proxy, metadata={"a": 1, "session_id": "mine", "turns": "req"})
    golden(proxy.registry.get(sid).trace)
    status, data = await post(
        http, f"{proxy.url}/sessions/{sid}/samples", {"metadata": {"a": 3, "b": 2}}
    )
    assert status == 200
    (s,) = decode_samples(data)
    assert s.metadata["a"] == 3 and s.metadata["b"] == 2  # collect call wins
    assert s.metadata["session_id"] == sid and s.metadata["turns"] == 2  # server beats request


@pytest.mark.parametrize(
    ("body", "raw", "needle"),
    [
        (None, b"{not json", "not valid JSON"),
        (None, b"[1, 2]", "JSON object"),
        ({"max_seq_len": "8"}, None, "max_seq_len"),
        ({"max_seq_len": 0}, None, "max_seq_len"),
        ({"max_seq_len": True}, None, "max_seq_len"),
        ({"metadata": [1]}, None, "metadata"),
        ({"max_seqlen": 8}, None, "unknown fields"),
    ],
)
async def test_malformed_collect_requests(
    proxy: Proxy, http: aiohttp.ClientSession, body: Any, raw: bytes | None, needle: str
) -> None:
    sid = await create(http, proxy)
    status, data = await post(http, f"{proxy.url}/sessions/{sid}/samples", body, raw)
    assert status == 400 and needle in err(data)


@pytest.mark.parametrize(
    "body",
    [
        {"ttl": -1},
        {"ttl": "1h"},
        {"group_id": 5},
        {"group_index": -1},
        {"metadata": "x"},
        {"max_turns": 0},
        {"colour": "red"},
    ],
)
async def test_malformed_create_requests(
    proxy: Proxy, http: aiohttp.ClientSession, body: Any
) -> None:
    status, data = await post(http, proxy.url + "/sessions", body)
    assert status == 400, data
    assert err(data)


async def test_caps_give_4xx_and_server_keeps_serving(
    proxy: Proxy, http: aiohttp.ClientSession
) -> None:
    api = api_of(proxy)
    big = b'{"metadata": {"x": "' + b"a" * (api.max_request_bytes + 10) + b'"}}'
    status, data = await post(http, proxy.url + "/sessions", raw=big)
    assert status == 413 and "over" in err(data)
    sids = [await create(http, proxy) for _ in range(4)]
    status, data = await post(http, proxy.url + "/sessions", {})
    assert status == 429 and "max_sessions" in err(data)
    golden(proxy.registry.get(sids[0]).trace)
    api.max_payload_bytes = 50
    status, data = await post(http, f"{proxy.url}/sessions/{sids[0]}/samples", {})
    assert status == 413 and "max_payload_bytes" in err(data)
    status, data = await post(http, f"{proxy.url}/sessions/{sids[0]}/samples", {"max_seq_len": 5})
    assert status == 200 and decode_samples(data)[0].tokens.tolist() == [1, 2, 3, 10, 11]


async def test_hook_error_is_422_naming_the_hook(proxy: Proxy, http: aiohttp.ClientSession) -> None:
    def exploding_picker(trace: Trace, leaves: list[int]) -> list[int]:
        raise RuntimeError("no leaves for you")

    api = api_of(proxy)
    api.picker = exploding_picker
    sid = await create(http, proxy)
    golden(proxy.registry.get(sid).trace)
    url = f"{proxy.url}/sessions/{sid}/samples"
    status, data = await post(http, url, {})
    assert status == 422
    msg = err(data)
    assert "exploding_picker" in msg and "no leaves for you" in msg
    async with SessionClient(proxy.url) as client:
        with pytest.raises(HookError, match="exploding_picker"):
            await client.samples(sid)
        api.picker = lambda trace, leaves: leaves  # the server keeps serving
        (s,) = await client.samples(sid)
        assert s.tokens.tolist() == [1, 2, 3, 10, 11, 20, 21, 30, 31]


async def test_internal_error_is_500_and_server_keeps_serving(
    proxy: Proxy, http: aiohttp.ClientSession
) -> None:
    sid = await create(http, proxy)
    golden(proxy.registry.get(sid).trace)
    api = api_of(proxy)
    real = api.collector.assemble

    def broken(*a: Any) -> bytes:
        raise ZeroDivisionError("bug")

    api.collector.assemble = broken  # type: ignore[method-assign,assignment]
    status, data = await post(http, f"{proxy.url}/sessions/{sid}/samples", {})
    assert status == 500 and "ZeroDivisionError" in err(data)
    api.collector.assemble = real  # type: ignore[method-assign]
    status, _ = await post(http, f"{proxy.url}/sessions/{sid}/samples", {})
    assert status == 200


async def test_custom_hooks_mounted_before_start() -> None:
    p = Proxy(DEAD_UPSTREAM)
    api = add_session_routes(p.app, p, picker=None, postprocess=None)
    async with p:
        assert api_of(p) is api
        session = p.create_session(trace=Trace())
        t = session.trace
        p1 = prompt(t, None, [("user", "u")], [1])
        complete(t, p1, [2], [-1.0], "stop")
        complete(t, p1, [3], [-1.0], "stop")  # a retry: kept, since picker=None
        async with SessionClient(p.url) as client:
            got = await client.samples(session.id)
        assert [s.tokens.tolist() for s in got] == [[1, 2], [1, 3]]


async def test_client_collect_deletes_and_survives_delete_failure(proxy: Proxy) -> None:
    async with SessionClient(proxy.url, timeout=30) as client:
        info = await client.create(metadata={"k": "v"}, group_id="grp", group_index=2)
        assert info.base_url.endswith(f"/sessions/{info.id}/v1")
        golden(proxy.registry.get(info.id).trace)
        summary = await client.get(info.id)
        assert summary["turns"] == 2
        trace = proxy.registry.get(info.id).trace
        got = await client.collect(info.id)
        assert same(
            got,
            assemble(
                trace,
                metadata={"k": "v"},
                computed={"session_id": info.id},
                group_id="grp",
                group_index=2,
            ),
        )
        assert got[0].group_id == "grp" and got[0].group_index == 2
        with pytest.raises(SessionError, match="deleted"):
            await client.get(info.id)

        info = await client.create()
        golden(proxy.registry.get(info.id).trace)

        async def failing_delete(session_id: str) -> None:
            raise ConnectionError("network down")

        client.delete = failing_delete  # type: ignore[method-assign]
        got = await client.collect(info.id)
        assert got[0].tokens.tolist() == [1, 2, 3, 10, 11, 20, 21, 30, 31]
        # A failed collect still raises its own error (not the delete's).
        with pytest.raises(SessionError, match="never existed"):
            await client.collect("missing")
        with pytest.raises(LimitError):
            for _ in range(5):
                await client.create()


async def test_client_timeout_and_unreachable_server() -> None:
    with pytest.raises(ValueError):
        SessionClient("http://127.0.0.1:9", timeout=0)
    async with SessionClient("http://127.0.0.1:9", timeout=5, retries=1) as client:
        from tracewire import ProxyError

        with pytest.raises(ProxyError, match="failed"):
            await client.samples("x")


async def test_torch_tensors_when_available(proxy: Proxy) -> None:
    async with SessionClient(proxy.url) as client:
        info = await client.create()
        golden(proxy.registry.get(info.id).trace)
        if importlib.util.find_spec("torch") is None:
            with pytest.raises(ImportError, match="torch"):
                await client.samples(info.id, tensors="torch")
        else:
            (d,) = await client.samples(info.id, tensors="torch")
            assert d["tokens"].tolist() == [1, 2, 3, 10, 11, 20, 21, 30, 31]


async def test_concurrent_commits_and_collects(proxy: Proxy) -> None:
    async with SessionClient(proxy.url) as client:
        info = await client.create()
        t = proxy.registry.get(info.id).trace
        p = prompt(t, None, [("user", "u")], [1])

        async def writer() -> None:
            parent = p
            for k in range(50):
                c = complete(t, parent, [100 + k] * 50, [-0.5] * 50, "tool_calls", tool=True)
                parent = prompt(t, c, [("tool", str(k))], [7])
                await asyncio.sleep(0)

        async def reader() -> list[list[Sample]]:
            return [await client.samples(info.id) for _ in range(10)]

        _, results = await asyncio.gather(writer(), reader())
        for samples in results:
            (s,) = samples
            assert s.status == "completed"
            n = len(s.spans)
            assert s.tokens.shape[0] == 1 + 51 * n - 1
        final = await client.samples(info.id)
        assert same(final, assemble(t, computed={"session_id": info.id}))


class _ThreadProxy:
    """A proxy served from its own loop in a thread, for the blocking client."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.proxy = Proxy(DEAD_UPSTREAM)
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self.proxy.start())
        self.ready.set()
        self.loop.run_forever()
        self.loop.run_until_complete(self.proxy.stop())
        self.loop.close()

    def __enter__(self) -> Proxy:
        self.thread.start()
        assert self.ready.wait(30)
        return self.proxy

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)


@pytest.fixture
def thread_proxy() -> Iterator[Proxy]:
    with _ThreadProxy() as p:
        yield p


def test_sync_client(thread_proxy: Proxy) -> None:
    with SyncSessionClient(thread_proxy.url) as client:
        info = client.create(metadata={"m": 1})
        trace = thread_proxy.registry.get(info.id).trace
        golden(trace)
        assert client.get(info.id)["turns"] == 2
        (s,) = client.collect(info.id, max_seq_len=8)
        assert s.status == "truncated" and s.metadata["m"] == 1
        assert np.array_equal(s.response_mask, [1, 1, 0, 0, 1])
        with pytest.raises(SessionError):
            client.get(info.id)


async def test_multi_megabyte_payload_streams(proxy: Proxy) -> None:
    async with SessionClient(proxy.url) as client:
        info = await client.create()
        t = proxy.registry.get(info.id).trace
        n = 300_000  # ~2.7 MB of payload
        p = prompt(t, None, [("user", "u")], np.arange(n, dtype=np.int32).tolist())
        complete(t, p, np.arange(n, dtype=np.int32).tolist(), [-0.25] * n, "stop")
        (s,) = await client.samples(info.id)
        assert s.tokens.shape == (2 * n,) and int(s.loss_mask.sum()) == n
        assert s.equals(assemble(t, computed={"session_id": info.id})[0])


async def test_every_session_route_needs_the_trainer_token(proxy: Proxy) -> None:
    # A harness holds its session's secret and the proxy URL; neither opens /sessions.
    session = proxy.create_session()
    routes = [("POST", "/sessions"), ("GET", f"/sessions/{session.id}"),
              ("POST", f"/sessions/{session.id}/samples"), ("DELETE", f"/sessions/{session.id}")]
    async with aiohttp.ClientSession() as http:
        for auth in (None, f"Bearer {session.secret}", "Bearer wrong", TOKEN):
            headers = {"Content-Type": "application/json"}
            if auth is not None:
                headers["Authorization"] = auth
            for method, path in routes:
                async with http.request(method, proxy.url + path, data=b"{}",
                                        headers=headers) as r:
                    data = await r.read()
                    assert r.status == 401, (auth, method, path)
                    if method == "GET" and auth in (None, f"Bearer {session.secret}"):
                        # An agent's read of its base URL: terse, names no variable.
                        assert err(data) == "unauthorized", (auth, method, path)
                    else:
                        assert "session token" in err(data)
    assert session.id in proxy.registry and len(proxy.registry) == 1
    async with SessionClient(proxy.url, token="wrong") as client:
        with pytest.raises(ProxyError, match="session token"):
            await client.get(session.id)
    async with SessionClient(proxy.url) as client:  # TRACEWIRE_SESSION_TOKEN by default
        assert (await client.get(session.id))["session_id"] == session.id


async def test_post_bodies_must_be_json(proxy: Proxy, http: aiohttp.ClientSession) -> None:
    # text/plain needs no CORS preflight, so a web page could send it; it is refused.
    sid = await create(http, proxy)
    for path in ("/sessions", f"/sessions/{sid}/samples"):
        for ctype in ("text/plain", "application/x-www-form-urlencoded", None):
            headers = {} if ctype is None else {"Content-Type": ctype}
            async with http.post(proxy.url + path, data=b"{}", headers=headers) as r:
                assert r.status == 415, (path, ctype)
                assert "application/json" in err(await r.read())
    assert len(proxy.registry) == 1


async def test_token_from_config_env_or_generated(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Proxy(DEAD_UPSTREAM).session_token == TOKEN
    p = Proxy(DEAD_UPSTREAM, config=ProxyConfig(session_token="given"))
    assert p.session_token == "given" and not p.session_token_generated
    monkeypatch.delenv(TOKEN_ENV)
    a, b = Proxy(DEAD_UPSTREAM), Proxy(DEAD_UPSTREAM)
    assert a.session_token_generated and len(a.session_token) > 20
    assert a.session_token != b.session_token


async def test_client_rebuilds_the_servers_error_with_its_reason(proxy: Proxy) -> None:
    async with SessionClient(proxy.url) as client:
        info = await client.create()
        with pytest.raises(SessionError) as never:
            await client.get("missing")
        assert never.value.reason == GoneReason.NEVER_EXISTED
        await client.delete(info.id)
        with pytest.raises(SessionError) as gone:
            await client.get(info.id)
        assert gone.value.reason == GoneReason.DELETED
        with pytest.raises(ProxyError, match=r"\$\.ttl"):  # a 400 names the field
            await client.create(ttl=-1)


async def test_unreadable_body_is_400_and_the_connection_recovers(
    proxy: Proxy, http: aiohttp.ClientSession
) -> None:
    # "Content-Encoding: gzip" over a plain body: the bytes cannot be decoded. The answer
    # is the request's fault (400, not an internal error) and closes that connection, so
    # the next request on the same client gets a fresh one instead of a dead socket.
    headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    async with http.post(proxy.url + "/sessions", data=b"not gzip", headers=headers) as r:
        assert r.status == 400 and "unreadable request body" in err(await r.read())
        assert r.headers.get("Connection", "").lower() == "close"
    assert len(proxy.registry) == 0
    await create(http, proxy)


async def test_the_proxys_one_sweeper_also_sweeps_the_session_api() -> None:
    # The registry and the session API's sample state are swept by one periodic task of
    # the proxy (ttl 2 s: it runs every second); an expired session loses its builder and
    # its kept payload starts its grace period without any request touching it.
    async with Proxy(DEAD_UPSTREAM, config=ProxyConfig(session_ttl_s=2.0)) as p:
        api = api_of(p)
        async with SessionClient(p.url) as client:
            info = await client.create()
            golden(p.registry.get(info.id).trace)
            await client.samples(info.id)
        sid = info.id
        assert sid in api.collector.builders and api.collector.collected[sid].closed_at is None
        p.registry.get(sid).last_used -= 60  # idle past its TTL
        for _ in range(300):  # the sweep is due within a second; allow a slow machine
            if sid not in api.collector.builders:
                break
            await asyncio.sleep(0.1)
        assert sid not in api.collector.builders and sid not in p.registry
        assert api.collector.collected[sid].closed_at is not None
        p.sweep()  # by hand too: the payload stays until its grace runs out
        assert sid in api.collector.collected
