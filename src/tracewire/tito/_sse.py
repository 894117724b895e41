"""Reading a model server's replies: a whole JSON body, or the parsed ``data:`` objects of
a streamed one, with every failure (an error status, malformed JSON, a broken connection)
an :class:`~tracewire.tito.UpstreamShapeError`."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

import aiohttp
import aiohttp.http_exceptions
import orjson

from ._codecs import error_message
from ._errors import UpstreamShapeError

__all__ = ["reply_json", "sse_objects"]


def reply_json(status: int, raw: bytes) -> Any:
    """The JSON of a whole reply; the server's own message (and its 4xx status) when it
    answered an error."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise UpstreamShapeError(f"model server answered non-JSON ({status})") from exc
    if status >= 400:
        raise UpstreamShapeError(error_message(data) or f"model server error {status}",
                                 status if status < 500 else 502)
    return data


async def sse_objects(http: aiohttp.ClientSession, url: str, payload: dict[str, Any]
                      ) -> AsyncGenerator[Any, None]:
    """POST ``payload`` to ``url`` and yield each ``data:`` object until ``[DONE]`` or the
    end; closing the iterator early closes the connection (the server then stops)."""
    try:
        async with http.post(url, data=orjson.dumps(payload),
                             headers={"Content-Type": "application/json"}) as resp:
            if resp.status >= 400:
                raw = await resp.read()
                try:
                    why = error_message(orjson.loads(raw))
                except orjson.JSONDecodeError:
                    why = None
                raise UpstreamShapeError(why or f"model server error {resp.status}",
                                         resp.status if resp.status < 500 else 502)
            async for line in resp.content:
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    return
                try:
                    obj = orjson.loads(data)
                except orjson.JSONDecodeError as exc:
                    raise UpstreamShapeError("model server streamed malformed JSON") from exc
                yield obj
    except aiohttp.http_exceptions.LineTooLong as exc:
        raise UpstreamShapeError("model server streamed an over-long line; not recorded") \
            from exc
    except (aiohttp.ClientError, aiohttp.http_exceptions.HttpProcessingError,
            TimeoutError) as exc:
        raise UpstreamShapeError(f"model server stream broke: {exc}") from exc
