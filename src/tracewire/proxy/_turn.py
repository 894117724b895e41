"""The turn pipeline: one harness request from its body to a committed (or failed) turn.

:class:`TurnPipeline` runs the steps in order, each in its own module and called only from
here: parse (``_dialect``; ``_anthropic``, ``_responses`` for the translated dialects), match
(``_match``), ask the upstream (the :class:`~tracewire.proxy.Upstream`), read its answer
(``_reply``), render the harness's answer (``_render``; ``_anthropic_render``,
``_responses_render``), commit (``_commit``). A streamed
turn runs the same parse, match and commit; its ask, read and render happen per chunk in
``_stream``. :class:`Turn` is one exchange's state between the steps. The sequence is
written down, and checked by a test, in docs/ARCHITECTURE.md ("One turn, one pass").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from aiohttp import web

from .._errors import UpstreamError
from ..samples import hook_name
from ..trace import Call, Span, hash16
from . import _commit
from ._adapter import Adapter
from ._config import ProxyConfig
from ._http import BadRequest, error_response
from ._match import context, match
from ._offload import offload
from ._prompt import PromptIds, parse_full, parse_tail
from ._rawjson import RawSpan
from ._reply import read_reply
from ._request import HarnessRequest
from ._session import Session
from ._stream import Gone, StreamRelay
from ._turn_types import Outcome, Prepared
from ._upstream_api import Upstream, UpstreamRequest

__all__ = ["NOT_FORWARDED", "Answer", "Turn", "TurnPipeline", "not_forwarded_flags",
           "replay"]

log = logging.getLogger("tracewire.proxy")

#: A remembered answer for SDK retries: (status, content type, body or SSE parts).
Answer = tuple[int, str, bytes | list[bytes]]
T = TypeVar("T")


class Turn:
    """One exchange between a harness and the upstream, from match to commit or failure."""

    __slots__ = ("adapter", "call", "ikey", "prep", "request", "rkey", "session", "up")

    def __init__(self, *, session: Session, adapter: Adapter, up: HarnessRequest,
                 prep: Prepared, call: Call, request: UpstreamRequest, rkey: str,
                 ikey: str | None) -> None:
        self.session = session
        self.adapter = adapter
        self.up = up
        self.prep = prep
        self.call = call
        #: What the upstream is asked.
        self.request = request
        #: Retry keys: request content (SDK retry headers) and ``Idempotency-Key``.
        self.rkey = rkey
        self.ikey = ikey

    def end_span(self) -> None:
        """Close the call's span now (kept when already closed)."""
        assert self.call.span is not None
        if self.call.span.end is None:
            self.call.span.end = time.time()

    def remember(self, answer: Answer) -> None:
        """Keep the answer for SDK retries of this request."""
        self.session.remember(self.rkey, answer)
        if self.ikey:
            self.session.remember(self.ikey, answer)


class TurnPipeline:
    """Parses a harness request, matches it against the session's graph, asks the
    upstream, renders the answer and commits; one per proxy, for streamed and unary turns."""

    def __init__(self, config: ProxyConfig, upstream: Upstream) -> None:
        self.config = config
        self.upstream = upstream

    async def offload(self, size: int, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``, in a worker thread when ``size`` bytes is over the config's
        ``thread_threshold_bytes`` (big bodies never stall the loop)."""
        return await offload(size, self.config.thread_threshold_bytes, fn, *args)

    def inline(self, size: int) -> bool:
        """Whether a step on ``size`` bytes runs right here on the loop (what
        :meth:`offload` would do): the steps below call it directly then, which skips two
        coroutine frames per step (~1.5 µs each, five steps a turn)."""
        return size <= self.config.thread_threshold_bytes

    async def run(self, request: web.Request, adapter: Adapter, session: Session,
                  body: bytes) -> web.StreamResponse:
        """Serve one harness request whose ``body`` was read: the whole turn."""
        try:
            turn = await self.prepare(request, adapter, session, body)
        except BadRequest as e:
            return self.refuse(session, adapter, e)
        if not isinstance(turn, Turn):
            return turn
        if turn.up.stream:
            return await self.stream(request, turn)
        return await self.unary(request, turn)

    def refuse(self, session: Session, adapter: Adapter, e: BadRequest) -> web.Response:
        """The error answer for a refused request; the trace still says why the agent
        stopped (a session limit is already recorded as the trace's stop)."""
        if e.code is None:
            _commit.fail(session.graph, Call(endpoint=adapter.endpoint), e.message)
        return e.response(adapter.dialect)

    # -- parse and match -------------------------------------------------------------------
    async def prepare(self, request: web.Request, adapter: Adapter, session: Session,
                      body: bytes) -> Turn | web.StreamResponse:
        """Parse and match ``body``: its turn, or the remembered answer when it is an SDK
        retry of a committed request. ``BadRequest`` when the body cannot be recorded."""
        up = await self.parse(adapter, session, body)
        hooks: list[str] = []
        if self.config.request_hooks:
            d = up.as_dict()
            for hook in self.config.request_hooks:
                r = hook(session, adapter.endpoint, d)
                if r is not None:
                    d = r
                hooks.append(hook_name(hook))
            up.forget_raw(d)
        stop = session.limit_reached()
        if stop is not None:
            session.trace.stop = stop
            session.trace.notify()
            raise BadRequest(400, f"session limit reached: {stop}", stop)
        # SDK retries of a committed request get the committed answer back.
        idem = request.headers.get("Idempotency-Key")
        rkey = "b:" + hash16(adapter.endpoint.encode() + up.retry_material).hex()
        ikey = f"i:{adapter.endpoint}:{idem}" if idem else None
        try:
            retry = int(request.headers.get("x-stainless-retry-count", "0") or 0)
        except ValueError:
            retry = 0
        cached = session.recall(ikey) if ikey else (session.recall(rkey) if retry > 0 else None)
        if cached is not None:
            return await replay(request, cached)
        size = sum(map(len, up.raws)) if up.raws is not None else len(body)
        prep = match(session, up) if self.inline(size) else await self.offload(
            size, match, session, up)
        ctx = context(session, prep) if self.upstream.wants_context else None
        session.trace.set_pending([nm.message for nm in prep.new])
        flags = not_forwarded_flags(session, up.unforwarded)
        call = Call(model=up.model, endpoint=adapter.endpoint, sampling=up.sampling,
                    span=Span(start=time.time()), hooks=tuple(hooks), flags=tuple(flags))
        hooked = bool(self.config.response_hooks)
        ureq = UpstreamRequest(up.payload(self.config.token_fields), stream=up.stream,
                               split=not hooked, context=ctx, flags=flags,
                               # a response hook is shown the whole answer
                               want_logprobs=up.want_logprobs or hooked)
        return Turn(session=session, adapter=adapter, up=up, prep=prep, call=call,
                    request=ureq, rkey=rkey, ikey=ikey)

    async def parse(self, adapter: Adapter, session: Session, body: bytes) -> HarnessRequest:
        """The parse step. A harness resends its history: when the messages extend the
        last committed request byte for byte, only the new ones are parsed and hashed."""
        sp = adapter.splice(body, session.graph.request_cache)
        if sp is not None:
            n = len(sp.rest)
            up = adapter.parse_spliced(sp) if self.inline(n) else await self.offload(
                n, adapter.parse_spliced, sp)
            if up is not None:
                return up
        if self.inline(len(body)):
            return adapter.parse(body, session.tool_args)
        return await self.offload(len(body), adapter.parse, body, session.tool_args)

    # -- ask, read, render -----------------------------------------------------------------
    async def outcome(self, turn: Turn) -> tuple[dict[str, Any], Outcome, bytes | None]:
        """Ask the upstream for a non-streamed answer and read it: (its dict, the outcome,
        the raw body when no hook replaced the dict). ``UpstreamError`` when it failed."""
        reply = await self.upstream.chat(turn.request)
        d, raw = reply.data, reply.raw
        call = turn.call
        for hook in self.config.response_hooks:
            res = hook(turn.session, call.endpoint, d)
            if res is not None:
                d, raw = res, None
            call.hooks = (*call.hooks, hook_name(hook))
        size = len(reply.raw) if reply.raw is not None else 0
        if reply.span is not None:
            size -= reply.span.end - reply.span.start  # the ids are read separately
        out = read_reply(d, reply) if self.inline(size) else await self.offload(
            size, read_reply, d, reply)
        if reply.span is not None:
            out.prompt = await self.read_prompt(turn.session, reply.span)
        return d, out, raw

    async def read_prompt(self, session: Session, span: RawSpan) -> PromptIds | None:
        """The prompt ids at ``span``: only the tail past the cached prompt is parsed when
        it extends it; otherwise the whole array, in a thread when big."""
        prompt = parse_tail(span, session.graph.prompt_cache)
        if prompt is None:
            prompt = await self.offload(span.end - span.start, parse_full, span)
        return prompt

    async def unary(self, request: web.Request, turn: Turn) -> web.StreamResponse:
        """Serve a non-streamed turn: ask, read, render, answer, then commit."""
        adapter = turn.adapter
        try:
            d, out, raw = await self.outcome(turn)
        except UpstreamError as exc:
            self.fail(turn, str(exc))
            return error_response(adapter.dialect, exc.status, str(exc))
        if request.transport is None or request.transport.is_closing():
            self.fail(turn, "harness disconnected before the answer")
            return web.Response(status=499)
        assert turn.call.span is not None
        turn.call.span.end = time.time()
        body = adapter.reply(turn.up, d, out, raw)
        turn.remember((200, "application/json", body))
        # The answer is complete and validated; recording it is not the harness's wait.
        # The response is written here (handed to the socket, which sends it at once
        # unless its buffer is full) and the turn committed right after, in this task:
        # before this connection's next request is read, and without a loop pass of its
        # own (a callback queued for the next pass cost one more wake-up per turn).
        resp = web.Response(body=body, content_type="application/json")
        try:
            await resp.prepare(request)
            await resp.write_eof()
        finally:
            self._commit_safely(turn, out)
        return resp

    async def stream(self, request: web.Request, turn: Turn) -> web.StreamResponse:
        """Serve a streamed turn: relay the chunks as they arrive, commit the turn once it
        completed, then close the stream."""
        adapter = turn.adapter
        relay = StreamRelay(request, adapter.streamer(turn.up), self.config.keepalive_s)
        chunks = self.upstream.stream_chat(turn.request)
        try:
            out, span = await relay.relay(chunks)
            if span is not None:
                out.prompt = await self.read_prompt(turn.session, span)
            if not out.choices or not all(ch.finish_reason for ch in out.choices):
                raise UpstreamError("upstream stream ended before the answer finished")
        except UpstreamError as exc:
            self.fail(turn, str(exc))
            resp = await relay.error(adapter.dialect, str(exc))
            return resp if resp is not None else error_response(
                adapter.dialect, exc.status, str(exc))
        except Gone:
            self.fail(turn, "harness disconnected mid-stream")
            return relay.resp if relay.resp is not None else web.Response(status=499)
        except asyncio.CancelledError:
            self.fail(turn, "harness disconnected mid-stream")
            raise
        finally:
            with contextlib.suppress(Exception):
                await chunks.aclose()  # type: ignore[attr-defined]
        self.commit(turn, out)
        resp = await relay.close(relay.streamer.done(out))
        turn.remember((200, "text/event-stream", relay.sent))
        return resp

    # -- commit ----------------------------------------------------------------------------
    def commit(self, turn: Turn, out: Outcome) -> None:
        """The commit step: append the turn to the session's trace, whole."""
        turn.end_span()
        _commit.commit(turn.session, turn.up, turn.prep, out, turn.call, turn.request.flags)

    def fail(self, turn: Turn, error: str) -> None:
        """Record the call as failed from the node the request matched (so samples of the
        branch are marked cut short), with ``error`` on the trace."""
        turn.end_span()
        _commit.fail(turn.session.graph, turn.call, error, prompt_node=turn.prep.parent)

    def _commit_safely(self, turn: Turn, out: Outcome) -> None:
        try:
            self.commit(turn, out)
        except Exception as exc:  # a bug: keep serving, and say so on the trace
            log.exception("recording a turn failed")
            self.fail(turn, f"recording the turn failed: {exc!r}")

    async def finish(self, session: Session) -> None:
        """Record what the upstream reports about the finished ``session`` (the
        token-in/token-out mismatch report) in its trace's ``info``."""
        report = await self.upstream.session_report(session.id, session.trace)
        if report:
            session.trace.info.update(report)
            session.trace.notify()


#: Call flag: some of the harness's tools were not forwarded (one ``NOT_FORWARDED + ":"
#: + name`` flag per tool follows it).
NOT_FORWARDED = "tools_not_forwarded"


def not_forwarded_flags(session: Session, names: list[str]) -> list[str]:
    """The call flags naming the tools that were not forwarded; the trace's
    ``info["tools_not_forwarded"]`` keeps every name seen in the session."""
    if not names:
        return []
    info = session.trace.info
    seen = info.get(NOT_FORWARDED)
    known = list(seen) if isinstance(seen, list) else []
    info[NOT_FORWARDED] = known + [n for n in dict.fromkeys(names) if n not in known]
    return [NOT_FORWARDED, *(f"{NOT_FORWARDED}:{n}" for n in dict.fromkeys(names))]


async def replay(request: web.Request, cached: Answer) -> web.StreamResponse:
    """Serve a remembered answer again (JSON, or the SSE parts as they were sent)."""
    status, ctype, body = cached
    if isinstance(body, bytes):
        return web.Response(status=status, body=body, content_type=ctype)
    resp = web.StreamResponse(status=status, headers={"Content-Type": ctype,
                                                      "Cache-Control": "no-cache"})
    await resp.prepare(request)
    for part in body:
        await resp.write(part)
    await resp.write_eof()
    return resp
