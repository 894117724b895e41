"""An agent's unauthenticated reads of its base URL (Claude Code HEADs /sessions/{id} before
it connects) get a terse 401 that names no variable; a trainer's refused write still gets
the hint where its token comes from."""

from __future__ import annotations

import aiohttp
import orjson

from tracewire.proxy import Proxy


async def test_agent_probes_get_a_terse_401(proxy: Proxy) -> None:
    s = proxy.create_session()
    url = f"{proxy.url}/sessions/{s.id}"
    async with aiohttp.ClientSession() as http:
        for method in ("HEAD", "GET"):
            for headers in ({}, {"x-api-key": s.secret}, {"Authorization": f"Bearer {s.secret}"},
                            {"anthropic-version": "2023-06-01", "x-api-key": s.secret}):
                async with http.request(method, url, headers=headers) as r:
                    body = await r.read()
                    assert r.status == 401, (method, headers)
                    if method == "GET":
                        d = orjson.loads(body)
                        assert d["error"] == "unauthorized", d
                    text = body.decode() + " ".join(f"{k}: {v}" for k, v in r.headers.items())
                    assert "TRACEWIRE" not in text and "TOKEN" not in text.upper(), text
        # Writes come from trainers: they are told where the token comes from.
        async with http.post(f"{proxy.url}/sessions", json={}) as r:
            assert r.status == 401
            assert "TRACEWIRE_SESSION_TOKEN" in (await r.json())["error"]
        async with http.get(url, headers={"Authorization": "Bearer not-the-token"}) as r:
            assert r.status == 401
            assert "session token" in (await r.json())["error"]
    # Nothing was consumed or changed by the probes: the session still serves its agent.
    assert s.id in proxy.registry
