"""The viewer's RL routes: groups of rollouts, diffs of two rollouts, run against run.

``/api/groups`` (list; ``spread=any|equal|mixed``, ``env``, ``q``, ``step_min``/``step_max``,
``sort``, ``order``, ``offset``, ``limit``); ``/api/groups/{group}`` (its rollouts with
rewards and advantages, and the neighbouring groups); ``/api/diff?a=EP&b=EP`` (optional
``ta``/``tb`` trace, ``la``/``lb`` leaf, ``b_run`` for an episode of another offered run);
``/api/runs`` (runs offered for comparison); ``/api/compare?b=RUN`` (per-task rewards of the
viewed run (A) and run B, each optionally cut to ``a_step_min``… / ``b_step_min``…).
All work happens in worker threads.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from ..trace import Episode
from ._compare import COMPARE_SORTS, Selection, compare
from ._diff import diff_episodes
from ._groups import GROUP_SORTS, GroupQuery
from ._http import (
    ID_RE,
    bad_request,
    json_bytes,
    json_response,
    not_found,
    param_choice,
    param_float,
    param_int,
    param_order,
    param_str,
)
from ._keys import RUNS, SOURCE
from ._source import RunSource

__all__ = ["add_rl_routes"]

#: Groups per list page at most; per-task rows per compare page at most.
MAX_GROUPS = 500
MAX_TASKS = 2000
#: A group key: a group id (train ids hold slashes) or ``task:<task_key>``; only looked up in
#: a dict, so any text without control characters, bounded.
GROUP_RE = re.compile(r"^[^\x00-\x1f\x7f]{1,512}$")


def _group_query(q: Mapping[str, str]) -> GroupQuery:
    return GroupQuery(
        spread=param_choice(q, "spread", ("any", "equal", "mixed"), "any") or "any",
        env=param_str(q, "env"), q=param_str(q, "q"),
        step_min=param_float(q, "step_min"), step_max=param_float(q, "step_max"),
        sort=param_choice(q, "sort", GROUP_SORTS, "arrival") or "arrival",
        order=param_order(q),
        offset=param_int(q, "offset", 0, lo=0, hi=10**9),
        limit=param_int(q, "limit", 50, lo=1, hi=MAX_GROUPS),
    )


def _timed(headers_ms: float) -> dict[str, str]:
    # Server time of the work, for benches and dev tools (never asserted in tests).
    return {"Server-Timing": f"db;dur={headers_ms:.3f}"}


async def _groups(request: web.Request) -> web.Response:
    q = _group_query(request.query)
    src = request.app[SOURCE]

    def work() -> tuple[bytes, float]:
        t0 = time.perf_counter()
        return json_bytes(src.groups.page(q)), (time.perf_counter() - t0) * 1000

    page, ms = await asyncio.to_thread(work)
    return json_response(page, headers=_timed(ms))


async def _group(request: web.Request) -> web.Response:
    key = request.match_info["key"]
    if not GROUP_RE.match(key):
        raise not_found("no such group")
    q = _group_query(request.query)
    src = request.app[SOURCE]

    def work() -> tuple[bytes | None, float]:
        t0 = time.perf_counter()
        got = src.groups.group(key, q)
        return (None if got is None else json_bytes(got)), (time.perf_counter() - t0) * 1000

    got, ms = await asyncio.to_thread(work)
    if got is None:
        raise not_found(f"no group {key!r} in this run")
    return json_response(got, headers=_timed(ms))


def _episode(src: RunSource, eid: str | None, which: str) -> Episode:
    if eid is None:
        raise bad_request(f"parameter {which!r} (an episode id) is required")
    if not ID_RE.match(eid):
        raise not_found(f"no episode {eid[:40]!r}")
    found = src.episode(eid)
    if found is None:
        raise not_found(f"no episode {eid!r} in run {src.run_dir.name!r}")
    return found[0]


def _side(q: Mapping[str, str], ep: Episode, t_name: str, leaf_name: str) -> tuple[int, int]:
    t = param_int(q, t_name, 0, lo=0, hi=10**6)
    if t >= len(ep.traces):
        raise not_found(f"episode {ep.id} has no trace {t}")
    n = len(ep.traces[t].nodes)
    leaf = param_int(q, leaf_name, n - 1, lo=0, hi=10**9) if n else -1
    if leaf >= n:
        raise not_found(f"trace {t} of {ep.id} has no node {leaf}")
    return t, leaf


async def _diff(request: web.Request) -> web.Response:
    q = request.query
    src = request.app[SOURCE]
    other = param_str(q, "b_run")
    reg = request.app[RUNS]

    def work() -> tuple[bytes, float]:
        t0 = time.perf_counter()
        src_b = src if other is None else reg.get(other)
        if src_b is None:
            raise not_found(f"no run {other!r} offered")
        a = _episode(src, param_str(q, "a"), "a")
        b = _episode(src_b, param_str(q, "b"), "b")
        ta, la = _side(q, a, "ta", "la")
        tb, lb = _side(q, b, "tb", "lb")
        got = json_bytes(diff_episodes(a, ta, la, b, tb, lb))
        return got, (time.perf_counter() - t0) * 1000

    got, ms = await asyncio.to_thread(work)
    return json_response(got, headers=_timed(ms))


async def _runs(request: web.Request) -> web.Response:
    reg = request.app[RUNS]

    def work() -> dict[str, Any]:
        return {"current": reg.name, "default": reg.default_other(), "runs": reg.listing()}

    return json_response(await asyncio.to_thread(work))


async def _compare(request: web.Request) -> web.Response:
    q = request.query
    reg = request.app[RUNS]
    name = param_str(q, "b", max_len=128) or reg.default_other() or reg.name
    sel_a = Selection(param_float(q, "a_step_min"), param_float(q, "a_step_max"))
    sel_b = Selection(param_float(q, "b_step_min"), param_float(q, "b_step_max"))
    sort = param_choice(q, "sort", COMPARE_SORTS, "diff") or "diff"
    order = param_order(q)
    offset = param_int(q, "offset", 0, lo=0, hi=10**9)
    limit = param_int(q, "limit", 200, lo=1, hi=MAX_TASKS)

    def work() -> bytes:
        src_b = reg.get(name)
        if src_b is None:
            raise not_found(f"no run {name!r} offered (see /api/runs)")
        out = compare(reg.main.index.snapshot(), sel_a, src_b.index.snapshot(), sel_b,
                      sort=sort, order=order, offset=offset, limit=limit)
        out["a"]["run"], out["b"]["run"] = reg.name, name
        # The page's rows link a diff of A's best against B's worst episode of the task.
        for side, src in (("a", reg.main), ("b", src_b)):
            seqs = [r[side + "_seq"] for r in out["rows"] if r[side + "_seq"] is not None]
            ids = dict(src.run().index_at(seqs, ["seq", "episode_id"])) if seqs else {}
            for r in out["rows"]:
                r[side + "_id"] = ids.get(r.pop(side + "_seq"))
        return json_bytes(out)

    return json_response(await asyncio.to_thread(work))


def add_rl_routes(r: web.UrlDispatcher) -> None:
    """Register the routes of this module on ``r``."""
    r.add_get("/api/groups", _groups)
    r.add_get("/api/groups/{key:.+}", _group)
    r.add_get("/api/diff", _diff)
    r.add_get("/api/runs", _runs)
    r.add_get("/api/compare", _compare)
