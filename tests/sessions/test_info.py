"""``SessionInfo`` names a session as ``proxy.Session`` does (``id``, ``secret``); the JSON of
``POST /sessions`` keeps its keys, and the old attribute names warn for one release."""

from __future__ import annotations

import aiohttp
import pytest

from tracewire.proxy import Proxy
from tracewire.sessions import SessionClient

DEAD_UPSTREAM = "http://127.0.0.1:9/v1"  # the session API never calls the upstream


async def test_session_info_uses_the_session_names_and_the_wire_keeps_its_keys() -> None:
    async with Proxy(DEAD_UPSTREAM) as proxy:
        async with SessionClient(proxy.url, token=proxy.session_token) as client:
            info = await client.create(group_id="g", group_index=3)
        session = proxy.registry.get(info.id)
        assert session is not None and session.id == info.id
        assert info.secret == session.secret and info.base_url == session.base_url
        with pytest.warns(DeprecationWarning, match=r"SessionInfo\.id"):
            assert info.session_id == info.id
        with pytest.warns(DeprecationWarning, match=r"SessionInfo\.secret"):
            assert info.api_key == info.secret
        # The wire answer is unchanged: a trainer without our client reads these keys.
        headers = {"Authorization": f"Bearer {proxy.session_token}"}
        async with aiohttp.ClientSession() as http, \
                http.post(proxy.url + "/sessions", json={}, headers=headers) as r:
            body = await r.json()
        assert r.status == 201, body
        assert {"session_id", "api_key", "base_url"} <= set(body)
        other = proxy.registry.get(body["session_id"])
        assert other is not None and other.secret == body["api_key"]
