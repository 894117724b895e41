"""The viewer's aiohttp application: static page, JSON API and live event streams.

Routes (all GET):
``/`` the page; ``/static/{name}`` its assets (a fixed set shipped in the package);
``/api/run``; ``/api/vocab`` (the run's tokenizer as a table of id pieces, or
``known: false``); ``/api/episodes`` (index page); ``/api/facets``; ``/api/stats``;
``/api/steps`` (per-step reward and mismatch of a train run);
``/api/episodes/{id}``; ``.../traces/{t}/timing``; ``.../traces/{t}/branches/{leaf}``
(nodes, paged); ``.../traces/{t}/branches/{leaf}/tokens`` (token window, binary or JSON;
``kinds=1`` adds each token's kind, ``extra=NAME`` an extra column);
``/api/events`` (server-sent events: live episodes, or one episode with ``?episode=``);
the RL routes (groups, diff, runs, compare) are in :mod:`._rl`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from aiohttp import web

from .._errors import StoreError
from ..trace import Episode
from ._health import HealthState
from ._http import (
    ID_RE,
    bad_request,
    error,
    error_middleware,
    json_response,
    not_found,
    param_bool,
    param_choice,
    param_float,
    param_int,
    param_order,
    param_str,
)
from ._index import RANGED, SORTABLE, IndexQuery
from ._keys import FEED, RUNS, SOURCE, STATIC
from ._live import LiveFeed
from ._rl import add_rl_routes
from ._runs import RunRegistry
from ._shapes import branch_page, episode_summary, heat_columns, timing, token_window
from ._source import RunSource
from ._steps import train_steps

__all__ = ["MAX_PAGE", "MAX_WINDOW", "SOURCE", "build_app"]

#: Most rows of the episode table per request.
MAX_PAGE = 500
#: Most nodes per branch page.
MAX_NODES = 2000
#: Most tokens per token-window request.
MAX_WINDOW = 65536
#: Seconds between keep-alive comments on an idle event stream.
KEEPALIVE_S = 15.0


_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css"}


def _load_static() -> dict[str, tuple[bytes, str]]:
    # Read once at start-up: the server only ever serves these names, so no URL can reach
    # another file.
    out: dict[str, tuple[bytes, str]] = {}
    for entry in resources.files("tracewire.view").joinpath("static").iterdir():
        suffix = Path(entry.name).suffix
        if entry.is_file() and suffix in _TYPES:
            out[entry.name] = (entry.read_bytes(), _TYPES[suffix])
    return out


async def _page(request: web.Request) -> web.Response:
    body, ctype = request.app[STATIC]["index.html"]
    return web.Response(body=body, content_type=ctype, headers={"Cache-Control": "no-cache"})


async def _static(request: web.Request) -> web.Response:
    item = request.app[STATIC].get(request.match_info["name"])
    if item is None:
        raise not_found("no such asset")
    body, ctype = item
    return web.Response(body=body, content_type=ctype, charset="utf-8",
                        headers={"Cache-Control": "no-cache"})


async def _run_info(request: web.Request) -> web.Response:
    src = request.app[SOURCE]

    def work() -> dict[str, Any]:
        return {"dir": src.run_dir.name, "meta": src.meta(), "episodes": src.index_count(),
                "tokenizer": src.vocab().ref.describe(), "columns": src.index.present(),
                "health": src.health()}

    return json_response(await asyncio.to_thread(work))


async def _vocab(request: web.Request) -> web.Response:
    src = request.app[SOURCE]
    # Built once per run in a worker thread (a 150k-id vocabulary takes a while to decode).
    body = await asyncio.to_thread(lambda: src.vocab().body())
    return web.Response(body=body, content_type="application/json",
                        headers={"Cache-Control": "private, max-age=3600"})


def _ranges(q: Any) -> tuple[tuple[str, float | None, float | None], ...]:
    out = []
    for c in RANGED:
        lo, hi = param_float(q, c + "_min"), param_float(q, c + "_max")
        if lo is not None or hi is not None:
            out.append((c, lo, hi))
    return tuple(out)


def _index_query(q: Any) -> IndexQuery:
    errors = param_bool(q, "errors")
    return IndexQuery(
        sort=param_choice(q, "sort", SORTABLE, "arrival") or "arrival",
        order=param_order(q),
        env=param_str(q, "env"),
        status=param_str(q, "status"),
        stop=param_str(q, "stop"),
        reward_min=param_float(q, "reward_min"),
        reward_max=param_float(q, "reward_max"),
        errors=errors,
        q=param_str(q, "q"),
        ranges=_ranges(q),
        offset=param_int(q, "offset", 0, lo=0, hi=10**9),
        limit=param_int(q, "limit", 50, lo=1, hi=MAX_PAGE),
    )


async def _episodes(request: web.Request) -> web.Response:
    query = _index_query(request.query)
    src = request.app[SOURCE]

    def work() -> tuple[dict[str, Any], float]:
        t0 = time.perf_counter()
        page = src.page(query)
        return page, (time.perf_counter() - t0) * 1000

    page, ms = await asyncio.to_thread(work)
    # Server time of the query, for benches and browser dev tools (never asserted in tests).
    return json_response(page, headers={"Server-Timing": f"db;dur={ms:.3f}"})


async def _steps(request: web.Request) -> web.Response:
    src = request.app[SOURCE]
    return json_response(await asyncio.to_thread(train_steps, src.run_dir, src.index))


async def _facets(request: web.Request) -> web.Response:
    src = request.app[SOURCE]
    return json_response(await asyncio.to_thread(src.index.facets))


async def _stats(request: web.Request) -> web.Response:
    bins = param_int(request.query, "bins", 20, lo=1, hi=200)
    src = request.app[SOURCE]
    return json_response(await asyncio.to_thread(src.index.stats, bins))


def _episode_id(request: web.Request) -> str:
    eid = request.match_info["id"]
    if not ID_RE.match(eid):
        raise not_found("no such episode")
    return eid


def _find(src: RunSource, eid: str) -> tuple[Episode, bool]:
    found = src.episode(eid)
    if found is None:
        raise not_found(f"no episode {eid!r} in this run")
    return found


def _trace_index(request: web.Request, ep: Episode) -> int:
    raw = request.match_info["t"]
    if not raw.isdigit() or int(raw) >= len(ep.traces):
        raise not_found("no such trace")
    return int(raw)


def _leaf(request: web.Request, ep: Episode, t: int) -> int:
    raw = request.match_info["leaf"]
    if not raw.isdigit() or int(raw) >= len(ep.traces[t].nodes):
        raise not_found("no such node")
    return int(raw)


async def _episode(request: web.Request) -> web.Response:
    eid = _episode_id(request)
    src = request.app[SOURCE]

    def work() -> dict[str, Any]:
        ep, live = _find(src, eid)
        out = episode_summary(ep, live=live)
        # A journal whose writer is gone is not running: say so rather than "live".
        out["stale"] = live and src.health()["state"] == HealthState.NEEDS_REPAIR
        return out

    return json_response(await asyncio.to_thread(work))


async def _timing(request: web.Request) -> web.Response:
    eid = _episode_id(request)
    src = request.app[SOURCE]

    def work() -> dict[str, Any]:
        ep, _ = _find(src, eid)
        return timing(ep, _trace_index(request, ep))

    return json_response(await asyncio.to_thread(work))


async def _branch(request: web.Request) -> web.Response:
    eid = _episode_id(request)
    offset = param_int(request.query, "offset", 0, lo=0, hi=10**9)
    limit = param_int(request.query, "limit", 200, lo=1, hi=MAX_NODES)
    src = request.app[SOURCE]

    def work() -> dict[str, Any]:
        ep, live = _find(src, eid)
        t = _trace_index(request, ep)
        page = branch_page(ep.traces[t], _leaf(request, ep, t), offset, limit)
        page["live"] = live
        return page

    return json_response(await asyncio.to_thread(work))


async def _tokens(request: web.Request) -> web.Response:
    eid = _episode_id(request)
    q = request.query
    start = param_int(q, "start", 0, lo=0, hi=2**31 - 1)
    end = param_int(q, "end", start + 4096, lo=0, hi=2**31 - 1)
    if end < start:
        raise bad_request("parameter 'end' must not be below 'start'")
    if end - start > MAX_WINDOW:
        raise bad_request(f"a token window holds at most {MAX_WINDOW} tokens")
    fmt = param_choice(q, "format", ("bin", "json"), "bin") or "bin"
    kinds = bool(param_bool(q, "kinds"))
    extra = param_str(q, "extra")
    src = request.app[SOURCE]

    def work() -> tuple[bytes | dict[str, Any], int, int, int, dict[str, str]]:
        ep, live = _find(src, eid)
        t = _trace_index(request, ep)
        if extra is not None and extra not in heat_columns(ep.traces[t]):
            raise not_found(f"trace {t} has no per-token column {extra!r}")
        cols = src.branch_columns(ep, live, t, _leaf(request, ep, t), extra)
        body, total = token_window(cols, start, end, fmt, kinds=kinds)
        s = min(start, total)
        more: dict[str, str] = {}
        if "extra" in cols and cols["extra"].size and np.isfinite(cols["extra"]).any():
            # The scale of the heat: the column's range over the whole branch.
            finite = cols["extra"][np.isfinite(cols["extra"])]
            more = {"X-Extra-Min": repr(float(finite.min())),
                    "X-Extra-Max": repr(float(finite.max()))}
        return body, total, s, min(end, total), more

    body, total, s, e, more = await asyncio.to_thread(work)
    headers = {"X-Token-Total": str(total), "X-Token-Start": str(s), "X-Token-End": str(e),
               **more}
    if isinstance(body, bytes):
        return web.Response(body=body, content_type="application/octet-stream", headers=headers)
    return json_response(body, headers=headers)


def _sse(event: str, data: Any) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


async def _events(request: web.Request) -> web.StreamResponse:
    episode = request.query.get("episode")
    if episode is not None and not ID_RE.match(episode):
        raise not_found("no such episode")
    feed = request.app[FEED]
    if not feed.acquire():
        raise error(web.HTTPServiceUnavailable, "too many open event streams")
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    try:
        await resp.prepare(request)
        poll = feed.state.poll
        sent_version = -1
        sent_sig: Any = None
        while not feed.closed:
            state = await feed.wait(poll, KEEPALIVE_S)
            if state.poll == poll:
                await resp.write(b": keep-alive\n\n")
                continue
            poll = state.poll
            if episode is None:
                if state.version != sent_version:
                    sent_version = state.version
                    await resp.write(_sse("live", {
                        "episodes": state.rows, "index_rows": state.index_rows,
                        "health": state.health, "steps": list(state.steps),
                    }))
            elif episode in state.summaries:
                sig = state.sigs[episode]
                if sig != sent_sig:
                    sent_sig = sig
                    await resp.write(_sse("episode", state.summaries[episode]))
            else:
                # Not in flight (any more): the page reloads it from the store.
                await resp.write(_sse("gone", {"id": episode}))
                break
        return resp
    except ConnectionResetError:
        return resp  # the page went away: nothing more to do
    finally:
        feed.release()


async def _on_cleanup(app: web.Application) -> None:
    await app[FEED].close()


def build_app(run_dir: str | Path, *, poll_interval: float = 0.25,
              compare: Sequence[str | Path] = ()) -> web.Application:
    """The viewer's aiohttp application for the run in ``run_dir`` (not started); runs in
    ``compare`` are offered for run-against-run (the first one by default)."""
    path = Path(run_dir)
    others = [Path(p) for p in compare]
    for p in (path, *others):
        if not p.is_dir():
            raise StoreError(f"{p} is not a run directory")
    source = RunSource(path)
    app = web.Application(middlewares=[error_middleware], client_max_size=64 * 1024)
    app[SOURCE] = source
    app[FEED] = LiveFeed(source, poll_interval)
    app[STATIC] = _load_static()
    app[RUNS] = RunRegistry(source, others)
    app.on_shutdown.append(_on_cleanup)
    r = app.router
    r.add_get("/", _page)
    r.add_get("/static/{name}", _static)
    r.add_get("/api/run", _run_info)
    r.add_get("/api/episodes", _episodes)
    r.add_get("/api/facets", _facets)
    r.add_get("/api/vocab", _vocab)
    r.add_get("/api/stats", _stats)
    r.add_get("/api/steps", _steps)
    r.add_get("/api/events", _events)
    base = "/api/episodes/{id}"
    r.add_get(base, _episode)
    r.add_get(base + "/traces/{t}/timing", _timing)
    r.add_get(base + "/traces/{t}/branches/{leaf}", _branch)
    r.add_get(base + "/traces/{t}/branches/{leaf}/tokens", _tokens)
    add_rl_routes(r)
    return app
