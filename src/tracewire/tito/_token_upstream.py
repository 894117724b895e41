"""The token-in/token-out :class:`~tracewire.proxy.Upstream`: the proxy's chat requests
answered by rendering the prompt here and asking the model server for ids.

For each chat-completions request: resolve its history against what this upstream served
before (bridge from the recorded ids, or re-render with a reason), send the prompt ids to
the server's token-in endpoint (:mod:`tracewire.tito.codecs`), parse the completion text
into an assistant message, record it, and answer a chat completion in vLLM's token-field
shape (``prompt_token_ids``, ``choices[0].token_ids``, ``logprobs.content`` with
``token_id:N`` tokens) — streamed as ``chat.completion.chunk`` s when asked, relaying text as
the server streams and tool calls once they parse.

Behind a :class:`~tracewire.proxy.Proxy` each request carries a
:class:`~tracewire.proxy.TurnContext` (``wants_context``): the session and the recorded ids
of the path its history extends, as the proxy matched them (the echoed assistant message
found by its digest, never re-rendered). The prompt is then those ids verbatim + junction +
the suffix of the new messages; a history the record cannot continue is rendered whole
(a new branch), counted per session by reason. Without a context (the upstream used on its
own) one shared :class:`~tracewire.tito.ConversationIndex` resolves histories. Rendering
runs in a worker thread, one at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from ..proxy import StreamChunk, TurnContext, Upstream, UpstreamReply, UpstreamRequest
from ..tokens import ChatTokenizer, IncrementalDecoder, LengthRule
from ..trace import InfoKey, Trace
from ._answer import chat_reply, delta_of, finish_of, stream_chunk
from ._codecs import (
    LENGTH_SLACK,
    Generation,
    GenerationDelta,
    SamplingParams,
    StreamDecoder,
    UpstreamApi,
    check_ids,
    decode_response,
    encode_request,
    refusal,
    request_path,
    sampling_keys,
)
from ._errors import TemplateError, TruncatedTurnError, UpstreamShapeError
from ._history import ConversationIndex
from ._llamacpp import WithheldIdsError
from ._parse import ParsedCompletion
from ._render import PromptBuilder
from ._report import session_report
from ._session import BranchTip, Plan, TokenSession
from ._sse import reply_json, sse_objects
from ._stream import StreamParser, parse_completion

__all__ = ["TokenUpstream"]

#: Bytes a reply may take per requested token (ids, logprobs, top-20 alternatives with
#: their text) before it is refused unread, plus a fixed allowance.
REPLY_BYTES_PER_TOKEN = 8192
REPLY_BYTES_FIXED = 1 << 20


def _too_long(n: int, params: SamplingParams) -> UpstreamShapeError | None:
    if n > params.max_tokens + LENGTH_SLACK:
        return UpstreamShapeError(f"upstream streamed {n} completion ids for max_tokens "
                                  f"{params.max_tokens}; not recorded")
    return None


@dataclass(slots=True)
class SessionState:
    """What token-in/token-out keeps per proxy session: its planner (counting bridges and
    re-renders by reason), the tools last sent, and the malformed tool calls returned."""

    session: TokenSession
    tip: BranchTip = field(default_factory=BranchTip)
    tools: Any = None
    malformed: int = 0
    turns: int = 0
    rerender_turns: list[int] = field(default_factory=list)


class TokenUpstream(Upstream):
    """Token-in/token-out over a model server at ``base_url`` (no ``/v1``), rendering with
    the tokenizer directory ``tokenizer`` (or a ready :class:`PromptBuilder`)."""

    def __init__(self, base_url: str, tokenizer: str | Path | PromptBuilder, *,
                 api: UpstreamApi | str = UpstreamApi.COMPLETIONS, model: str = "",
                 timeout_s: float = 600.0, default_max_tokens: int = 4096,
                 length_rule: LengthRule = LengthRule.CLOSE,
                 max_sessions: int = 100_000) -> None:
        self.base_url = base_url.rstrip("/")
        self.builder = (tokenizer if isinstance(tokenizer, PromptBuilder)
                        else PromptBuilder(ChatTokenizer(tokenizer), length_rule=length_rule))
        self.api = UpstreamApi(api)
        self.model = model
        self.timeout_s = timeout_s
        self.default_max_tokens = default_max_tokens
        self.session = TokenSession(self.builder, ConversationIndex(shared=True))
        self.max_sessions = max_sessions
        self._states: OrderedDict[str, SessionState] = OrderedDict()
        self._http: aiohttp.ClientSession | None = None
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        """Open the HTTP client."""
        if self._http is None:
            self._http = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout_s))

    async def close(self) -> None:
        """Close the HTTP client."""
        if self._http is not None:
            await self._http.close()
            self._http = None

    # -- request side ---------------------------------------------------------------

    def _sampling(self, body: dict[str, Any]) -> SamplingParams:
        if int(body.get("n") or 1) != 1:
            raise UpstreamShapeError("token-in/token-out serves n=1 only", 400)
        why = refusal(self.api, body)
        if why is not None:
            raise UpstreamShapeError(why, 400)
        mt = body.get("max_completion_tokens", body.get("max_tokens"))
        top = body.get("top_logprobs")
        temp, top_p = body.get("temperature"), body.get("top_p")
        return SamplingParams(
            max_tokens=int(mt) if isinstance(mt, int) and mt > 0 else self.default_max_tokens,
            temperature=1.0 if temp is None else float(temp),
            top_p=1.0 if top_p is None else float(top_p),
            stop_ids=self.builder.family.stop_ids,
            top_logprobs=int(top) if isinstance(top, int) else 0,
            extra={k: body[k] for k in ("temperature", "top_p", *sampling_keys(self.api))
                   if k in body})

    wants_context = True

    def state(self, session_id: str) -> SessionState:
        """The per-session state of ``session_id`` (created on first use; the least
        recently used goes once ``max_sessions`` are kept)."""
        st = self._states.get(session_id)
        if st is None:
            st = self._states[session_id] = SessionState(
                TokenSession(self.builder, ConversationIndex()))
            while len(self._states) > self.max_sessions:
                self._states.popitem(last=False)
        else:
            self._states.move_to_end(session_id)
        return st

    def _plan_sync(self, msgs: list[Any], tools: Any, ctx: TurnContext | None) -> Plan:
        if ctx is None:
            return self.session.plan(msgs, tools)
        st = self.state(ctx.session_id)
        st.tools = tools
        plan = st.session.plan_on(msgs, tools, new=ctx.new_messages,
                                  base_ids=st.tip.take(ctx.base_ids),
                                  base_sampled=ctx.base_sampled,
                                  ended_by_stop=ctx.base_ended_by_stop,
                                  recorded=ctx.recorded, root_role=ctx.root_role)
        if plan.reason is not None:
            st.rerender_turns.append(st.turns)
        st.turns += 1
        return plan

    async def _plan(self, body: dict[str, Any], request: UpstreamRequest) -> Plan:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise TemplateError("the request has no messages")
        async with self._lock:
            try:
                return await asyncio.to_thread(self._plan_sync, msgs, body.get("tools"),
                                               request.context)
            except (TemplateError, TruncatedTurnError) as exc:
                raise _as_upstream_error(exc) from exc

    def _url(self) -> str:
        return self.base_url + request_path(self.api)

    def _http_client(self) -> aiohttp.ClientSession:
        if self._http is None:
            raise UpstreamShapeError("TokenUpstream used before start()")
        return self._http

    def _think_opened(self, plan: Plan) -> bool:
        # Some generation prompts open the reasoning block themselves (Qwen3.5's ends in
        # "<think>\n"): the completion then starts inside it.
        return self.builder.tok.decode(plan.point.buffer.ids[
            max(0, plan.point.length - 4):plan.point.length]).rstrip().endswith("<think>")

    async def _commit(self, plan: Plan, parsed: ParsedCompletion, gen: Generation,
                      request: UpstreamRequest) -> None:
        if parsed.malformed:
            # The call is returned as the text the model wrote; the trace says so.
            request.flags.append("malformed_tool_call")
        if any(lp != lp for lp in gen.logprobs):
            # NaN: a token the server sampled without reporting its probability (llama-server
            # withholds tokens that end mid-character); the trace says which call.
            request.flags.append("logprob_unknown")
        ctx = request.context
        if ctx is not None:
            st = self.state(ctx.session_id)
            st.malformed += len(parsed.malformed)
            st.tip.keep(plan, ctx.base_ids, gen.ids)
            return  # the proxy's trace records the turn; nothing to index here
        async with self._lock:
            self.session.commit(plan, parsed.as_message(), gen.ids, gen.ended_by_stop)

    def _decode(self, status: int, raw: bytes, params: SamplingParams, plan: Plan,
                logprobs: bool = True) -> tuple[Generation, ParsedCompletion, dict[str, Any]]:
        # Parse, validate (ids within the vocabulary, no more than asked for), detokenize
        # and build the answer: in a worker thread when the reply is big.
        gen = decode_response(self.api, reply_json(status, raw), stop_ids=params.stop_ids)
        check_ids(gen.ids, vocab_size=self.builder.tok.vocab_size,
                  max_tokens=params.max_tokens)
        parsed = parse_completion(self.builder.tok.decode(gen.ids), self.builder.family,
                                  think_opened=self._think_opened(plan))
        return gen, parsed, chat_reply(self.model, plan.prompt_ids, parsed, gen,
                                       logprobs=logprobs)

    async def _ask_whole(self, body: dict[str, Any], request: UpstreamRequest
                         ) -> tuple[Plan, Generation, ParsedCompletion, dict[str, Any]]:
        params = self._sampling(body)
        plan = await self._plan(body, request)
        payload = encode_request(self.api, plan.prompt_ids, params, model=self.model,
                                 stream=False)
        status, raw = await self._post(payload, params)
        gen, parsed, reply = await self.offload(len(raw), self._decode, status, raw, params,
                                                plan, request.want_logprobs)
        await self._commit(plan, parsed, gen, request)
        return plan, gen, parsed, reply

    # -- Upstream -------------------------------------------------------------------

    async def chat(self, request: UpstreamRequest) -> UpstreamReply:
        """One non-streamed turn (see module docstring)."""
        _, gen, _, reply = await self._ask_whole(request.body(), request)
        raw = None
        if len(gen.ids) * 8 > self.thread_threshold_bytes:
            # A big answer goes with its bytes (they equal ``reply``): the proxy sizes its
            # work by them and reads the answer in a worker thread, off the event loop.
            raw = await asyncio.to_thread(orjson.dumps, reply)
        return UpstreamReply(reply, raw, None,
                             logprobs=None if request.want_logprobs else gen.logprobs)

    async def _post(self, payload: dict[str, Any], params: SamplingParams
                    ) -> tuple[int, bytes]:
        # A reply is bounded by what was asked for: a runaway body is refused unread.
        cap = REPLY_BYTES_FIXED + REPLY_BYTES_PER_TOKEN * params.max_tokens
        raw = bytearray()
        try:
            async with self._http_client().post(self._url(), data=orjson.dumps(payload),
                                                headers={"Content-Type": "application/json"}
                                                ) as resp:
                if (resp.content_length or 0) > cap:
                    raise UpstreamShapeError(f"model server answered {resp.content_length} "
                                             f"bytes for max_tokens {params.max_tokens}; "
                                             "not recorded")
                async for part in resp.content.iter_chunked(1 << 16):
                    raw += part
                    if len(raw) > cap:
                        raise UpstreamShapeError(f"model server answered over {cap} bytes "
                                                 f"for max_tokens {params.max_tokens}; "
                                                 "not recorded")
                status = resp.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise UpstreamShapeError(f"model server unreachable: {exc}") from exc
        return status, bytes(raw)

    async def stream_chat(self, request: UpstreamRequest) -> AsyncIterator[StreamChunk]:
        """One streamed turn: text relayed as the server streams, tool calls once parsed,
        each chunk carrying its ``token_ids`` and logprobs; prompt ids on the first."""
        body = request.body()
        cid = "chatcmpl-" + uuid.uuid4().hex
        if self.api is UpstreamApi.GENERATE:
            # Asked whole (its streamed shape is not documented), relayed as one chunk.
            plan, gen, parsed, reply = await self._ask_whole(body, request)
            msg = parsed.as_message()
            delta = {k: v for k, v in msg.items() if v is not None}
            if "tool_calls" in delta:
                delta["tool_calls"] = [{"index": i, **tc}
                                       for i, tc in enumerate(delta["tool_calls"])]
            yield self._chunk(stream_chunk(self.model, cid, delta, gen.ids, gen.logprobs,
                                           finish_of(gen, parsed), plan.prompt_ids,
                                           usage=reply["usage"]))
            return
        params = self._sampling(body)
        plan = await self._plan(body, request)
        payload = encode_request(self.api, plan.prompt_ids, params, model=self.model,
                                 stream=True)
        dec = StreamDecoder(self.api, stop_ids=params.stop_ids)
        detok = IncrementalDecoder(self.builder.tok)
        parser = StreamParser(self.builder.family, think_opened=self._think_opened(plan))
        vocab = self.builder.tok.vocab_size
        first = True
        n_calls = 0
        rest: Generation | None = None
        async with contextlib.aclosing(sse_objects(self._http_client(), self._url(),
                                                   payload)) as objs:
            async for obj in objs:
                try:
                    piece = dec.feed(obj)
                except WithheldIdsError:
                    # Closing the stream stops the server; the rest is asked unstreamed.
                    rest = await self._rest_unstreamed(plan, params, dec.gen.ids)
                    request.flags.append("stream_resumed_unstreamed")
                    piece = GenerationDelta(rest.ids, rest.logprobs, "", rest.finish_reason)
                    dec.gen.ids.extend(rest.ids)
                    dec.gen.logprobs.extend(rest.logprobs)
                    dec.gen.finish_reason = rest.finish_reason
                if len(piece.logprobs) != len(piece.ids):
                    raise UpstreamShapeError("streamed chunk: logprob count differs "
                                             "from its token count; not recorded")
                too_long = _too_long(len(dec.gen.ids), params)
                if too_long is not None:
                    raise too_long
                check_ids(piece.ids, vocab_size=vocab)
                if piece.ids or first:
                    events = parser.feed(detok.add(piece.ids))
                    delta, n_calls = delta_of(events, n_calls)
                    if first:
                        delta.setdefault("role", "assistant")
                    yield self._chunk(stream_chunk(
                        self.model, cid, delta, piece.ids, piece.logprobs, None,
                        plan.prompt_ids if first else None))
                    first = False
                if dec.done or rest is not None:
                    break  # llama-server's last chunk, or a stop id it does not know
        gen = dec.finish()
        events = parser.close()
        delta, n_calls = delta_of(events, n_calls)
        await self._commit(plan, parser.result, gen, request)
        yield self._chunk(stream_chunk(
            self.model, cid, delta, [], [], finish_of(gen, parser.result),
            plan.prompt_ids if first else None,
            usage={"prompt_tokens": plan.point.length, "completion_tokens": len(gen.ids),
                   "total_tokens": plan.point.length + len(gen.ids)}))

    async def _rest_unstreamed(self, plan: Plan, params: SamplingParams, got: list[int]
                               ) -> Generation:
        # After ``got`` streamed ids llama-server withheld some: ask for the rest from
        # there, unstreamed (every id comes back). The withheld draw is discarded unseen,
        # so the redraw is unbiased; a harness seed is moved on, since reusing it would
        # replay random numbers the earlier draws already used.
        left = params.max_tokens - len(got)
        if left <= 0:
            return Generation([], [], "length")
        extra = dict(params.extra)
        if isinstance(extra.get("seed"), int):
            extra["seed"] = (extra["seed"] + len(got) + 1) % 2**32
        p = dataclasses.replace(params, max_tokens=left, extra=extra)
        status, raw = await self._post(encode_request(self.api, [*plan.prompt_ids, *got], p,
                                                      model=self.model), p)
        gen = decode_response(self.api, reply_json(status, raw), stop_ids=params.stop_ids)
        check_ids(gen.ids, vocab_size=self.builder.tok.vocab_size, max_tokens=left)
        return gen

    @staticmethod
    def _chunk(d: dict[str, Any]) -> StreamChunk:
        return StreamChunk(b"data: " + orjson.dumps(d), d, None)

    async def models(self) -> bytes:
        """The one model this upstream serves."""
        return orjson.dumps({"object": "list", "data": [
            {"id": self.model or "model", "object": "model", "owned_by": "tracewire"}]})

    async def session_report(self, session_id: str, trace: Trace) -> dict[str, Any] | None:
        """The session's mismatch report (recorded ids vs a canonical render of each
        branch's conversation, computed in a worker thread) with its bridge and re-render
        counts: ``{"tito_mismatch": N, "tito": {...}}``. None for a session not served."""
        st = self._states.get(session_id)
        if st is None:
            return None
        st.tip = BranchTip()  # a finished session's ids need not stay in memory
        # Not under the planner's lock: a long branch's report must not hold up the turns
        # of every other session (reports serialize among themselves in session_report).
        rep = await asyncio.to_thread(session_report, self.builder, trace, st.tools,
                                      tools_of=st.session.tools_of)
        tito = {**rep, "bridges": st.session.bridges,
                "rerenders": dict(st.session.rerenders),
                "rerender_turns": list(st.rerender_turns),
                "malformed_tool_calls": st.malformed}
        return {InfoKey.TITO_MISMATCH: int(rep["mismatch"]), InfoKey.TITO: tito}

    async def count_tokens(self, body: dict[str, Any]) -> int:
        """Prompt tokens of ``body`` as a full render (the template, not the bridge)."""
        r = await asyncio.to_thread(self.builder.render_full, body.get("messages") or [],
                                    body.get("tools"))
        return len(r.ids)


def _as_upstream_error(exc: Exception) -> UpstreamShapeError:
    # The Upstream contract: every failure is an UpstreamError carrying the status to answer
    # (400 for a template failure, 409 for extending a length-cut turn).
    return UpstreamShapeError(str(exc), int(getattr(exc, "status", 400)))
