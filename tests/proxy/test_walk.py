"""One non-streamed chat turn walks the proxy's modules once, in pipeline order.

The walk is recorded with ``sys.setprofile`` over a real turn: the official openai SDK as
the harness, a real :class:`~tracewire.proxy.Proxy` on loopback, and the fake vLLM server
(``fake_upstream``) on loopback behind it. What counts is written in docs/ARCHITECTURE.md
("One turn, one pass"): every fresh call into a function of a ``tracewire`` module is an
entry, its caller is the nearest frame below it that runs ``tracewire`` code (None when
only asyncio, aiohttp, the SDK or this test are below), and a coroutine resuming after an
``await`` is not an entry. The rules: only the app (``_server``), the pipeline (``_turn``)
or code outside tracewire call into the app or the pipeline; only the pipeline calls a
step module; the pipeline enters the steps in the documented order, each in one stay.
"""

from __future__ import annotations

import asyncio
import inspect
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

import openai
import pytest

from tracewire.proxy import Proxy, ProxyConfig

APP = "tracewire.proxy._server"
PIPELINE = "tracewire.proxy._turn"
#: The steps of a non-streamed chat turn, in order: parse, match, ask the upstream, read
#: its answer, render the harness's answer, commit.
STEPS = ("tracewire.proxy._dialect", "tracewire.proxy._match",
         "tracewire.proxy._upstream_http", "tracewire.proxy._reply",
         "tracewire.proxy._render", "tracewire.proxy._commit")
#: Modules that run a function they are handed (inline, or in a thread when its input is
#: big) and are seen through: the caller of that function is whoever handed it over.
CARRIERS = ("tracewire.proxy._offload",)
_RESUMABLE = (inspect.CO_COROUTINE | inspect.CO_GENERATOR | inspect.CO_ASYNC_GENERATOR
              | inspect.CO_ITERABLE_COROUTINE)


@dataclass(frozen=True)
class Entry:
    """A call into a tracewire function: the module and function entered, and the module
    of the nearest tracewire frame below it (None: called from outside tracewire)."""

    caller: str | None
    module: str
    function: str


def _module(frame: types.FrameType) -> str:
    return str(frame.f_globals.get("__name__", ""))


@contextmanager
def recording() -> Iterator[list[Entry]]:
    """Record the entries into tracewire functions made on this thread meanwhile."""
    entries: list[Entry] = []
    started: dict[int, types.FrameType] = {}  # kept alive, so ids are not reused
    for task in asyncio.all_tasks():  # coroutines already running resume, not start
        coro: Any = task.get_coro()
        while coro is not None and getattr(coro, "cr_frame", None) is not None:
            started[id(coro.cr_frame)] = coro.cr_frame
            coro = coro.cr_await

    def profile(frame: types.FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        module = _module(frame)
        if not module.startswith("tracewire."):
            return
        if frame.f_code.co_flags & _RESUMABLE:
            if id(frame) in started:
                return  # a coroutine resuming after an await
            started[id(frame)] = frame
        below = frame.f_back
        while below is not None and (not _module(below).startswith("tracewire.")
                                     or _module(below) in CARRIERS):
            below = below.f_back
        entries.append(Entry(_module(below) if below is not None else None, module,
                             frame.f_code.co_qualname))

    sys.setprofile(profile)
    try:
        yield entries
    finally:
        sys.setprofile(None)
        started.clear()


def check(entries: list[Entry]) -> tuple[list[str], list[str]]:
    """(the step modules in the order the pipeline entered them, one per stay; the
    entries that break the rules, described)."""
    order: list[str] = []
    problems: list[str] = []
    for e in entries:
        if e.caller == e.module:
            continue
        if e.module in (APP, PIPELINE):
            if e.caller not in (None, APP, PIPELINE):
                problems.append(f"{e.caller} calls back into {e.module} ({e.function})")
        elif e.module in STEPS:
            if e.caller != PIPELINE:
                problems.append(f"{e.caller} calls the step {e.module} ({e.function}); "
                                "only the pipeline calls steps")
            elif not order or order[-1] != e.module:
                order.append(e.module)
    return order, problems


def handovers(entries: list[Entry], module: str, caller: str | None) -> list[str]:
    """The functions of ``module`` entered from ``caller``."""
    return [e.function for e in entries if e.module == module and e.caller == caller]


async def walk_turn(proxy: Proxy, turns: int, *, stream: bool = False) -> list[Entry]:
    """Run ``turns`` chat turns of one session; returns the entries of the last one, from
    the request leaving the harness to the turn being on the trace."""
    s = proxy.create_session()
    client = openai.AsyncOpenAI(base_url=s.base_url, api_key=s.secret, max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "be brief"},
                                      {"role": "user", "content": "hi"}]
    try:
        for k in range(turns):
            last = k == turns - 1
            with recording() if last else _nothing() as entries:
                if stream:
                    text = ""
                    async for chunk in await client.chat.completions.create(
                            model="m", messages=cast(Any, messages), stream=True):
                        text += "".join(ch.delta.content or "" for ch in chunk.choices)
                else:
                    r = await client.chat.completions.create(
                        model="m", messages=cast(Any, messages))
                    text = r.choices[0].message.content or ""
                for _ in range(200):  # the commit runs on the loop's next pass
                    if len(s.trace.calls) == k + 1:
                        break
                    await asyncio.sleep(0.005)
            assert len(s.trace.calls) == k + 1 and s.trace.calls[-1].node is not None
            messages += [{"role": "assistant", "content": text},
                         {"role": "user", "content": f"again {k}"}]
    finally:
        await client.close()
    return entries


@contextmanager
def _nothing() -> Iterator[list[Entry]]:
    yield []


@pytest.fixture
async def proxy(upstream: str) -> Any:
    async with Proxy(upstream, config=ProxyConfig(keepalive_s=0.2)) as p:
        yield p


@pytest.mark.parametrize("turns", [1, 3], ids=["first_turn", "third_turn"])
async def test_a_chat_turn_enters_each_step_once_in_order(proxy: Proxy, turns: int) -> None:
    # The first turn parses the whole body; the third extends the second's request byte
    # for byte, so its parse splices onto the cached prefix.
    entries = await walk_turn(proxy, turns)
    order, problems = check(entries)
    assert problems == []
    assert order == list(STEPS)
    # The app hands the turn to the pipeline once; the commit is the loop's callback.
    assert handovers(entries, APP, None) == ["Proxy._handler.<locals>.handle"]
    assert handovers(entries, PIPELINE, APP) == ["TurnPipeline.run"]
    assert handovers(entries, PIPELINE, None) == ["TurnPipeline._commit_soon"]


async def test_a_streamed_turn_never_calls_back_into_the_app(proxy: Proxy) -> None:
    # A stream asks, reads and renders per chunk inside _stream, so only the callback
    # rule applies to it (the order check is for unary turns).
    entries = await walk_turn(proxy, 2, stream=True)
    _, problems = check(entries)
    assert [p for p in problems if "calls back" in p] == []
    assert handovers(entries, PIPELINE, APP) == ["TurnPipeline.run"]
    assert "StreamRelay.relay" in handovers(entries, "tracewire.proxy._stream", PIPELINE)


async def test_a_step_calling_back_into_the_app_fails_the_walk(
        proxy: Proxy, monkeypatch: pytest.MonkeyPatch) -> None:
    # A deliberate callback: the render step reads a property of the app while it renders.
    from tracewire.proxy import _render

    real = _render.strip_added

    def strip_and_ask_the_app(d: dict[str, Any], **kw: bool) -> None:
        assert proxy.url  # Proxy.url runs in the app's module, called from _render
        real(d, **kw)

    monkeypatch.setattr(_render, "strip_added", strip_and_ask_the_app)
    _, problems = check(await walk_turn(proxy, 1))
    assert problems == [f"tracewire.proxy._render calls back into {APP} (Proxy.url)"]


async def test_a_sideways_hop_between_steps_fails_the_walk(
        proxy: Proxy, monkeypatch: pytest.MonkeyPatch) -> None:
    # A deliberate hop: the render step asks the parse step's module for something.
    from tracewire.proxy import _dialect, _rawjson, _render

    real = _rawjson.render

    def render_and_parse(d: dict[str, Any], span: Any) -> bytes:
        _dialect.parse_chat_bytes(b'{"messages": []}')
        return real(d, span)

    monkeypatch.setattr(_render, "render", render_and_parse)
    _, problems = check(await walk_turn(proxy, 1))
    assert problems == ["tracewire.proxy._render calls the step tracewire.proxy._dialect "
                        "(parse_chat_bytes); only the pipeline calls steps"]


def test_steps_out_of_order_or_entered_twice_are_seen() -> None:
    # The order check on its own: the parse step's module entered again after rendering.
    p, d, m, r = PIPELINE, *STEPS[:2], STEPS[4]
    order, problems = check([Entry(p, d, "parse"), Entry(p, m, "match"),
                             Entry(p, r, "reply"), Entry(p, d, "reply")])
    assert problems == [] and order == [d, m, r, d] != list(STEPS)
