"""A loopback relay between the proxy and the model server that keeps what the proxy sent
upstream: each request's method, path and body bytes (headers are left out: they name
ports and library versions, not tracewire's choices)."""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["UpstreamTap"]


class UpstreamTap:
    """``async with UpstreamTap(model.base_url) as tap``: point the proxy at ``tap.base_url``;
    ``tap.frames()`` is the msgpack list of ``[method, path, body]`` it relayed."""

    def __init__(self, base_url: str) -> None:
        self.target = base_url.removesuffix("/v1")
        self.seen: list[list[Any]] = []
        self.base_url = ""
        self._runner: Any = None
        self._http: Any = None

    async def __aenter__(self) -> UpstreamTap:
        import aiohttp
        from aiohttp import web

        app = web.Application(client_max_size=1 << 28)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.base_url = f"http://127.0.0.1:{port}/v1"
        self._http = aiohttp.ClientSession(auto_decompress=False)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._http.close()
        await self._runner.cleanup()

    async def _forward(self, request: Any) -> Any:
        from aiohttp import web

        body = await request.read()
        self.seen.append([request.method, request.path_qs, body])
        headers = {k: v for k, v in request.headers.items()
                   if k.lower() in ("content-type", "accept", "content-encoding")}
        async with self._http.request(request.method, self.target + request.path_qs,
                                      data=body, headers=headers) as r:
            out = web.StreamResponse(status=r.status, headers={
                k: v for k, v in r.headers.items()
                if k.lower() in ("content-type", "content-encoding", "cache-control")})
            await out.prepare(request)
            async for chunk in r.content.iter_any():
                await out.write(chunk)
            await out.write_eof()
            return out

    def frames(self) -> bytes:
        """What the proxy sent, in order, as one msgpack value."""
        return msgspec.msgpack.encode(self.seen)
