from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tracewire.proxy import Proxy, ProxyConfig

from .fake_upstream import Fake, serve


@pytest.fixture
def fake() -> Fake:
    return Fake()


@pytest.fixture
async def upstream(fake: Fake) -> AsyncIterator[str]:
    runner, url = await serve(fake)
    yield url
    await runner.cleanup()


@pytest.fixture
async def proxy(upstream: str) -> AsyncIterator[Proxy]:
    async with Proxy(upstream, config=ProxyConfig(keepalive_s=0.2)) as p:
        yield p
