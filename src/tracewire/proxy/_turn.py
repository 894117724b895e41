"""The turn pipeline: one harness request from parsed body to committed (or failed) turn.

:class:`Turn` carries one exchange (session, adapter, upstream request, call, match, retry
keys) and is the only thing the streaming relay (``_stream``) and the unary path below
need: they ask the :class:`~tracewire.proxy.Upstream` for the answer, relay it, and end the
turn with :meth:`Turn.commit` or :meth:`Turn.fail`.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from aiohttp import web

from .._errors import UpstreamError
from ..samples import hook_name
from ..trace import Call, Span
from ._config import ProxyConfig
from ._dialect import Adapter, HarnessRequest
from ._graph import Outcome, Prepared, RequestCache
from ._http import BadRequest, error_response
from ._prompt import PromptIds, parse_full, parse_tail
from ._rawjson import RawSpan
from ._session import Session
from ._upstream import outcome_of
from ._upstream_api import TurnContext, Upstream, UpstreamRequest, offload
from ._validate import load_json

__all__ = ["Answer", "Turn", "TurnPipeline"]

log = logging.getLogger("tracewire.proxy")

#: A remembered answer for SDK retries: (status, content type, body or SSE parts).
Answer = tuple[int, str, bytes | list[bytes]]
T = TypeVar("T")


class Offload(Protocol):
    """``await offload(size, fn, *args)``: ``fn(*args)``, in a thread when ``size`` is big."""

    async def __call__(self, size: int, fn: Callable[..., T], *args: Any) -> T: ...


class Turn:
    """One exchange between a harness and the upstream, from match to commit or failure."""

    __slots__ = ("adapter", "call", "ikey", "offload", "prep", "request", "rkey", "session",
                 "up", "upstream")

    def __init__(self, *, session: Session, adapter: Adapter, up: HarnessRequest, prep: Prepared,
                 call: Call, request: UpstreamRequest, upstream: Upstream, rkey: str,
                 ikey: str | None, offload: Offload) -> None:
        self.session = session
        self.adapter = adapter
        self.up = up
        self.prep = prep
        self.call = call
        #: What the upstream is asked, and who answers it.
        self.request = request
        self.upstream = upstream
        #: Retry keys: request content (SDK retry headers) and ``Idempotency-Key``.
        self.rkey = rkey
        self.ikey = ikey
        #: Runs big parses in a worker thread (the proxy's ``thread_threshold_bytes``).
        self.offload = offload

    def end_span(self) -> None:
        """Close the call's span now (kept when already closed)."""
        assert self.call.span is not None
        if self.call.span.end is None:
            self.call.span.end = time.time()

    def commit(self, out: Outcome) -> None:
        """Append the turn to the session's trace (whole, without awaiting) and update the
        session's caches, counters and tool-call texts."""
        self.end_span()
        session, up = self.session, self.up
        graph = session.graph
        nodes = graph.commit(self.prep, out, self.call, up.all_messages)
        if self.request.flags and nodes:
            flags = tuple(dict.fromkeys(self.request.flags))
            for c in session.trace.calls[-len(nodes):]:
                c.flags = flags
        span = up.msgs_span
        if nodes and span is not None and up.hasher is not None:
            last = session.trace.nodes[nodes[0]].parent
            if last is not None:
                graph.request_cache = RequestCache(span, span.content_end(), last, up.hasher)
        session.turns += 1
        for ch in out.choices:
            for tc in ch.tool_calls:
                if tc.id:
                    session.tool_args[tc.id] = tc.arguments
        total = out.usage.get("total_tokens")
        if total is None and out.prompt is not None:
            total = len(out.prompt) + max(
                (len(c.token_ids or ()) for c in out.choices), default=0)
        session.last_total_tokens = int(total or 0)

    def fail(self, error: str) -> None:
        """Record the call as failed from the node the request matched (so samples of the
        branch are marked cut short), with ``error`` on the trace."""
        self.end_span()
        self.session.graph.fail(self.call, error, prompt_node=self.prep.parent)

    def remember(self, answer: Answer) -> None:
        """Keep the answer for SDK retries of this request."""
        self.session.remember(self.rkey, answer)
        if self.ikey:
            self.session.remember(self.ikey, answer)

    async def read_prompt(self, span: RawSpan) -> PromptIds | None:
        """The prompt ids at ``span``: only the tail past the cached prompt is parsed when
        it extends it; otherwise the whole array, in a thread when big."""
        prompt = parse_tail(span, self.session.graph.prompt_cache)
        if prompt is None:
            prompt = await self.offload(span.end - span.start, parse_full, span)
        return prompt


class TurnPipeline:
    """Parses a harness request, matches it against the session's graph, asks the
    upstream, and commits; one per proxy."""

    def __init__(self, config: ProxyConfig, upstream: Upstream) -> None:
        self.config = config
        self.upstream = upstream

    async def offload(self, size: int, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``, in a worker thread when ``size`` bytes is over the config's
        ``thread_threshold_bytes`` (big bodies never stall the loop)."""
        return await offload(size, self.config.thread_threshold_bytes, fn, *args)

    async def prepare(self, request: web.Request, adapter: Adapter, session: Session,
                      body: bytes) -> Turn | web.StreamResponse:
        """The turn for ``body``, or the remembered answer when it is an SDK retry of a
        committed request. ``BadRequest`` when the body cannot be recorded."""
        off = self.offload
        up: HarnessRequest | None = None
        # A harness resends its history: when the messages extend the last committed
        # request byte for byte, only the new ones are parsed and hashed.
        sp = adapter.splice(body, session.graph.request_cache)
        if sp is not None:
            up = await off(len(sp.rest), adapter.parse_spliced, sp)
        if up is None:
            up = await off(len(body), adapter.parse, body, session.tool_args)
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
        rkey = "b:" + hashlib.blake2b(
            adapter.endpoint.encode() + up.retry_material, digest_size=16).hexdigest()
        ikey = f"i:{adapter.endpoint}:{idem}" if idem else None
        try:
            retry = int(request.headers.get("x-stainless-retry-count", "0") or 0)
        except ValueError:
            retry = 0
        cached = session.recall(ikey) if ikey else (session.recall(rkey) if retry > 0 else None)
        if cached is not None:
            return await replay(request, cached)
        size = sum(len(r) for r in up.raws) if up.raws is not None else len(body)
        prep = await off(size, _match, session, up)
        session.trace.set_pending([nm.message for nm in prep.new])
        flags = not_forwarded_flags(session, up.unforwarded)
        call = Call(model=up.model, endpoint=adapter.endpoint, sampling=up.sampling,
                    span=Span(start=time.time()), hooks=tuple(hooks), flags=tuple(flags))
        fields = self.config.token_fields
        if up.stream and not up.want_usage:
            # Streams report usage only when asked: the upstream always is, so Call.usage
            # is filled; the chat streamer hides the usage chunk from a harness that did not.
            fields = _with_usage(up, fields)
        payload = up.upstream_bytes(fields)
        hooked = bool(self.config.response_hooks)
        ureq = UpstreamRequest(payload, stream=up.stream, split=not hooked,
                               context=(_context(session, prep) if self.upstream.wants_context
                                        else None), flags=flags,
                               # a response hook is shown the whole answer
                               want_logprobs=up.want_logprobs or hooked)
        return Turn(session=session, adapter=adapter, up=up, prep=prep, call=call,
                    request=ureq, upstream=self.upstream, rkey=rkey, ikey=ikey,
                    offload=self.offload)

    async def finish(self, session: Session) -> None:
        """Record what the upstream reports about the finished ``session`` (the
        token-in/token-out mismatch report) in its trace's ``info``."""
        report = await self.upstream.session_report(session.id, session.trace)
        if report:
            session.trace.info.update(report)
            session.trace.notify()

    async def outcome(self, turn: Turn) -> tuple[dict[str, Any], Outcome, bytes | None]:
        """Ask the upstream for a non-streamed answer: (its dict, the outcome, the raw body
        when no hook replaced the dict). ``UpstreamError`` when it failed."""
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
        try:
            out = await self.offload(size, outcome_of, d, reply.span is not None)
        except (ValueError, TypeError, AttributeError) as exc:
            raise UpstreamError(f"upstream answered something unusable: {exc}") from exc
        if reply.logprobs is not None and out.choices:
            out.choices[0].logprobs = reply.logprobs  # handed over, not in the dict
        if reply.span is not None:
            out.span = reply.span
            out.prompt = await turn.read_prompt(reply.span)
        return d, out, raw

    async def unary(self, request: web.Request, turn: Turn) -> web.StreamResponse:
        """Serve a non-streamed turn."""
        adapter = turn.adapter
        try:
            d, out, raw = await self.outcome(turn)
        except UpstreamError as exc:
            turn.fail(str(exc))
            return error_response(adapter.dialect, exc.status, str(exc))
        if request.transport is None or request.transport.is_closing():
            turn.fail("harness disconnected before the answer")
            return web.Response(status=499)
        assert turn.call.span is not None
        turn.call.span.end = time.time()
        body = adapter.reply(turn.up, d, out, raw)
        turn.remember((200, "application/json", body))
        # The answer is complete and validated; recording it is not the harness's wait.
        # aiohttp writes the response right after this returns, and a callback queued now
        # runs on the next loop pass, before any request that reaches us after the answer
        # (asyncio runs queued callbacks before those of newly polled I/O).
        asyncio.get_running_loop().call_soon(_commit_soon, turn, out)
        return web.Response(body=body, content_type="application/json")


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


def _with_usage(up: HarnessRequest, fields: dict[str, Any]) -> dict[str, Any]:
    """The upstream fields with ``stream_options.include_usage`` on, kept with the
    harness's other stream options (dict form: set in the body itself)."""
    if up.body is not None:
        opts = up.body.get("stream_options")
        up.body["stream_options"] = {**(opts if isinstance(opts, dict) else {}),
                                     "include_usage": True}
        return fields
    assert up.top is not None
    opts = load_json(up.top["stream_options"], "stream_options") \
        if "stream_options" in up.top else None
    return {**fields, "stream_options": {**(opts if isinstance(opts, dict) else {}),
                                         "include_usage": True}}


def _match(session: Session, up: HarnessRequest) -> Prepared:
    g = session.graph
    parent, k = g.match_fast(up.hashes, up.base) if up.hashes is not None else (None, 0)
    try:
        rest = up.new_messages(k)
    except (ValueError, TypeError) as exc:
        raise BadRequest(400, f"bad message: {exc}") from exc
    parent, new = g.match_rest(parent, rest)
    return Prepared(parent, new)


def _context(session: Session, prep: Prepared) -> TurnContext:
    """The matched history for an upstream that renders prompts itself."""
    trace = session.trace
    parent = prep.parent
    ids = None
    sampled, by_stop = False, True
    if parent is not None:
        _, ok, path = session.graph.path_ids(parent)
        ids = path.copy() if ok and path is not None else None
        sampled = trace.nodes[parent].sampled
        if sampled:
            for c in reversed(trace.calls):  # the matching call is almost always last
                if c.node == parent:
                    by_stop = c.finish_reason != "length"
                    break
    root = trace.nodes[0].message.role if trace.nodes else None
    return TurnContext(session.id, len(prep.new), ids, sampled, by_stop, bool(trace.nodes),
                       root)


def _commit_soon(turn: Turn, out: Outcome) -> None:
    try:
        turn.commit(out)
    except Exception as exc:  # a bug: keep serving, and say so on the trace
        log.exception("recording a turn failed")
        turn.fail(f"recording the turn failed: {exc!r}")


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
