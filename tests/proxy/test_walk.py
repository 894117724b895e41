"""One non-streamed turn of each dialect walks the proxy's modules once, in pipeline order.

The walk is recorded with ``sys.setprofile`` over a real turn: the official openai SDK
(chat completions, Responses) or anthropic SDK (Messages) as the harness, a real
:class:`~tracewire.proxy.Proxy` on loopback, and the fake vLLM server (``fake_upstream``) on
loopback behind it. What counts is written in docs/ARCHITECTURE.md
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
from typing import Any

import anthropic
import openai
import pytest

from tracewire.proxy import Proxy, ProxyConfig, Session
from tracewire.trace import Endpoint

APP = "tracewire.proxy._server"
PIPELINE = "tracewire.proxy._turn"
#: The steps of a non-streamed chat turn, in order: parse, match, ask the upstream, read
#: its answer, render the harness's answer, commit.
STEPS = ("tracewire.proxy._dialect", "tracewire.proxy._match",
         "tracewire.proxy._upstream_http", "tracewire.proxy._reply",
         "tracewire.proxy._render", "tracewire.proxy._commit")
#: The steps of a non-streamed turn per dialect: the translated dialects parse and render in
#: their own modules; match, ask, read and commit are the same modules for every dialect.
DIALECT_STEPS = {
    Endpoint.CHAT: STEPS,
    Endpoint.MESSAGES: ("tracewire.proxy._anthropic", *STEPS[1:4],
                        "tracewire.proxy._anthropic_render", STEPS[5]),
    Endpoint.RESPONSES: ("tracewire.proxy._responses", *STEPS[1:4],
                         "tracewire.proxy._responses_render", STEPS[5]),
}
#: Every step module of any dialect: none of them may call another (no sideways hop).
STEP_MODULES = frozenset(m for steps in DIALECT_STEPS.values() for m in steps)
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
        elif e.module in STEP_MODULES:
            if e.caller != PIPELINE:
                problems.append(f"{e.caller} calls the step {e.module} ({e.function}); "
                                "only the pipeline calls steps")
            elif not order or order[-1] != e.module:
                order.append(e.module)
    return order, problems


def handovers(entries: list[Entry], module: str, caller: str | None) -> list[str]:
    """The functions of ``module`` entered from ``caller``."""
    return [e.function for e in entries if e.module == module and e.caller == caller]


async def ask(endpoint: Endpoint, client: Any, history: list[dict[str, Any]],
              stream: bool) -> str:
    """One harness request in ``endpoint``'s dialect with its SDK; the answer's text."""
    text = ""
    if endpoint is Endpoint.CHAT:
        messages = [{"role": "system", "content": "be brief"}, *history]
        if stream:
            async for chunk in await client.chat.completions.create(
                    model="m", messages=messages, stream=True):
                text += "".join(ch.delta.content or "" for ch in chunk.choices)
            return text
        r = await client.chat.completions.create(model="m", messages=messages)
        return str(r.choices[0].message.content or "")
    if endpoint is Endpoint.MESSAGES:
        kw: dict[str, Any] = {"model": "m", "max_tokens": 64, "system": "be brief",
                              "messages": history}
        if stream:
            async for ev in await client.messages.create(**kw, stream=True):
                if ev.type == "content_block_delta" and ev.delta.type == "text_delta":
                    text += ev.delta.text
            return text
        m = await client.messages.create(**kw)
        return "".join(b.text for b in m.content if b.type == "text")
    if stream:
        async for ev in await client.responses.create(
                model="m", input=history, instructions="be brief", stream=True):
            if ev.type == "response.output_text.delta":
                text += ev.delta
        return text
    r = await client.responses.create(model="m", input=history, instructions="be brief")
    return str(r.output_text)


def sdk_client(endpoint: Endpoint, s: Session) -> Any:
    """The official SDK client a harness of ``endpoint``'s dialect would use."""
    if endpoint is Endpoint.MESSAGES:
        return anthropic.AsyncAnthropic(base_url=s.anthropic_base_url, api_key=s.secret,
                                        max_retries=0)
    return openai.AsyncOpenAI(base_url=s.base_url, api_key=s.secret, max_retries=0)


async def walk_turn(proxy: Proxy, turns: int, *, stream: bool = False,
                    endpoint: Endpoint = Endpoint.CHAT) -> list[Entry]:
    """Run ``turns`` turns of one session in ``endpoint``'s dialect; returns the entries of
    the last one, from the request leaving the harness to the turn being on the trace."""
    s = proxy.create_session()
    client = sdk_client(endpoint, s)
    history: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
    try:
        for k in range(turns):
            last = k == turns - 1
            with recording() if last else _nothing() as entries:
                text = await ask(endpoint, client, history, stream)
                for _ in range(200):  # a stream commits before its last event
                    if len(s.trace.calls) == k + 1:
                        break
                    await asyncio.sleep(0.005)
            assert len(s.trace.calls) == k + 1 and s.trace.calls[-1].node is not None
            assert s.trace.calls[-1].endpoint == endpoint and text
            history += [{"role": "assistant", "content": text},
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


DIALECTS = [Endpoint.CHAT, Endpoint.MESSAGES, Endpoint.RESPONSES]


@pytest.mark.parametrize("endpoint", DIALECTS, ids=[str(e) for e in DIALECTS])
@pytest.mark.parametrize("turns", [1, 3], ids=["first_turn", "third_turn"])
async def test_a_turn_enters_each_step_once_in_order(proxy: Proxy, turns: int,
                                                     endpoint: Endpoint) -> None:
    # The first turn parses the whole body; a third chat turn extends the second's request
    # byte for byte, so its parse splices onto the cached prefix (translated dialects
    # parse in full every time, in their own module).
    entries = await walk_turn(proxy, turns, endpoint=endpoint)
    order, problems = check(entries)
    assert problems == []
    assert order == list(DIALECT_STEPS[endpoint])
    # The app hands the turn to the pipeline once, and the pipeline runs it to the commit:
    # nothing enters it from outside (no callback of its own).
    assert handovers(entries, APP, None) == ["Proxy._handler.<locals>.handle"]
    assert handovers(entries, PIPELINE, APP) == ["TurnPipeline.run"]
    assert handovers(entries, PIPELINE, None) == []


#: The streamer class each dialect's render module relays a stream with.
STREAMERS = {Endpoint.CHAT: "_ChatStreamer", Endpoint.MESSAGES: "_AnthropicStreamer",
             Endpoint.RESPONSES: "_ResponsesStreamer"}


@pytest.mark.parametrize("endpoint", DIALECTS, ids=[str(e) for e in DIALECTS])
async def test_a_streamed_turn_never_calls_back_into_the_app(proxy: Proxy,
                                                             endpoint: Endpoint) -> None:
    # A stream asks, reads and renders per chunk inside _stream, so only the callback
    # rule applies to it (the order check is for unary turns).
    entries = await walk_turn(proxy, 2, stream=True, endpoint=endpoint)
    _, problems = check(entries)
    assert [p for p in problems if "calls back" in p] == []
    assert handovers(entries, PIPELINE, APP) == ["TurnPipeline.run"]
    assert "StreamRelay.relay" in handovers(entries, "tracewire.proxy._stream", PIPELINE)
    # The pipeline parses in the dialect's parse module; the relay has the chunks rendered
    # by the dialect's render module.
    parse, render = DIALECT_STEPS[endpoint][0], DIALECT_STEPS[endpoint][4]
    assert handovers(entries, parse, PIPELINE)
    assert f"{STREAMERS[endpoint]}.chunk" in handovers(entries, render,
                                                       "tracewire.proxy._stream")


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


async def test_a_hop_between_a_translated_dialects_steps_fails_the_walk(
        proxy: Proxy, monkeypatch: pytest.MonkeyPatch) -> None:
    # A deliberate hop: the Messages render step translates a request again, in the parse
    # step's module, while it renders.
    from tracewire.proxy import _anthropic, _anthropic_render

    real = _anthropic_render._usage

    def usage_and_parse(out: Any) -> dict[str, int]:
        _anthropic.to_chat({"messages": []})
        return real(out)

    monkeypatch.setattr(_anthropic_render, "_usage", usage_and_parse)
    _, problems = check(await walk_turn(proxy, 1, endpoint=Endpoint.MESSAGES))
    assert problems == ["tracewire.proxy._anthropic_render calls the step "
                        "tracewire.proxy._anthropic (to_chat); only the pipeline calls steps"]
