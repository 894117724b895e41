"""One body reader for the whole proxy app (``_http.read_body``): the dialect routes and the
session API bound bodies the same way, whether the size is declared or the body is chunked,
against a real proxy and the fake upstream on 127.0.0.1."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson

from tracewire.proxy import Proxy, ProxyConfig, add_session_routes

MSGS = [{"role": "user", "content": "hi"}]
TOKEN = "tws-bodies"


async def _chunked(data: bytes, size: int = 4096) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


async def _post(url: str, data: Any, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as c, c.post(
            url, data=data, headers={"Content-Type": "application/json", **headers}) as r:
        return r.status, orjson.loads(await r.read())


async def test_dialect_routes_bound_declared_and_chunked_bodies(upstream: str) -> None:
    async with Proxy(upstream, config=ProxyConfig(max_body_bytes=1000)) as p:
        s = p.create_session()
        auth = {"Authorization": f"Bearer {s.secret}"}
        big = orjson.dumps({"messages": [{"role": "user", "content": "x" * 5000}]})
        url = s.base_url + "/chat/completions"
        for data in (big, _chunked(big)):
            st, d = await _post(url, data, auth)
            assert st == 413 and d["error"]["message"] == "request body over 1000 bytes"
        # A body exactly at the cap is read (and answered), chunked or not.
        ok = orjson.dumps({"messages": MSGS})
        ok += b" " * (1000 - len(ok))
        for data in (ok, _chunked(ok, 100)):
            st, d = await _post(url, data, auth)
            assert st == 200, d
        st, d = await _post(url, ok + b" ", auth)
        assert st == 413


async def test_session_api_bounds_chunked_bodies_with_its_own_cap(upstream: str) -> None:
    async with Proxy(upstream, config=ProxyConfig(session_token=TOKEN)) as p:
        api = add_session_routes(p.app, p)
        api.max_request_bytes = 2000  # below the app's max_body_bytes
        auth = {"Authorization": f"Bearer {TOKEN}"}
        big = orjson.dumps({"metadata": {"x": "a" * 3000}})
        for data in (big, _chunked(big)):
            st, d = await _post(p.url + "/sessions", data, auth)
            assert st == 413 and d["type"] == "LimitError"
            assert d["message"] == "request body over 2000 bytes"
        assert len(p.registry) == 0
        st, d = await _post(p.url + "/sessions", _chunked(orjson.dumps({"metadata": {}})), auth)
        assert st == 201 and d["session_id"] in p.registry


async def test_each_route_keeps_its_order_of_refusals(upstream: str) -> None:
    # A body that is both declared too big and of the wrong type: the turn routes refuse
    # the size first (413), the session API the type first (415), as each always has.
    async with Proxy(upstream, config=ProxyConfig(max_body_bytes=1000,
                                                  session_token=TOKEN)) as p:
        s = p.create_session()
        text = {"Content-Type": "text/plain"}
        st, d = await _post(s.base_url + "/chat/completions", b"x" * 5000,
                            {"Authorization": f"Bearer {s.secret}", **text})
        assert st == 413 and d["error"]["message"] == "request body over 1000 bytes"
        st, d = await _post(s.base_url + "/chat/completions", b"{}",
                            {"Authorization": f"Bearer {s.secret}", **text})
        assert st == 415 and "not text/plain" in d["error"]["message"]
        st, d = await _post(p.url + "/sessions", io.BytesIO(b"x" * (2 << 20)),
                            {"Authorization": f"Bearer {TOKEN}", **text})
        assert st == 415 and d["message"] == (
            "content type must be application/json, not 'text/plain'")
