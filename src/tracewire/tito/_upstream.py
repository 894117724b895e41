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
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from ..proxy import StreamChunk, TurnContext, Upstream, UpstreamReply, UpstreamRequest
from ..trace import Trace
from ._codecs import (
    Generation,
    SamplingParams,
    StreamDecoder,
    UpstreamApi,
    decode_response,
    encode_request,
    error_message,
    request_path,
)
from ._errors import TemplateError, TruncatedTurnError, UpstreamShapeError
from ._family import LengthRule
from ._history import ConversationIndex
from ._parse import ParsedCompletion
from ._render import PromptBuilder
from ._report import session_report
from ._session import BranchTip, Plan, TokenSession
from ._stream import StreamParser, parse_completion
from ._tokenizer import ChatTokenizer, IncrementalDecoder

__all__ = ["TokenUpstream"]

_SAMPLING = ("temperature", "top_p", "top_k", "min_p", "presence_penalty",
             "frequency_penalty", "repetition_penalty", "seed")


def _finish(gen: Generation, parsed: ParsedCompletion) -> str:
    if gen.finish_reason == "stop" and parsed.tool_calls:
        return "tool_calls"
    return gen.finish_reason or "stop"


def _logprobs(gen: Generation) -> dict[str, Any]:
    return {"content": [{"token": f"token_id:{i}", "logprob": lp, "bytes": None,
                         "top_logprobs": []} for i, lp in zip(gen.ids, gen.logprobs,
                                                             strict=True)]}


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
        mt = body.get("max_completion_tokens", body.get("max_tokens"))
        top = body.get("top_logprobs")
        return SamplingParams(
            max_tokens=int(mt) if isinstance(mt, int) and mt > 0 else self.default_max_tokens,
            temperature=float(body.get("temperature", 1.0)),
            top_p=float(body.get("top_p", 1.0)),
            stop_ids=self.builder.family.stop_ids,
            top_logprobs=int(top) if isinstance(top, int) else 0,
            extra={k: body[k] for k in _SAMPLING if k in body})

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
        ctx = request.context
        if ctx is not None:
            st = self.state(ctx.session_id)
            st.malformed += len(parsed.malformed)
            st.tip.keep(plan, ctx.base_ids, gen.ids)
            return  # the proxy's trace records the turn; nothing to index here
        async with self._lock:
            self.session.commit(plan, parsed.as_message(), gen.ids, gen.ended_by_stop)

    def _reply(self, plan: Plan, parsed: ParsedCompletion, gen: Generation) -> dict[str, Any]:
        prompt = plan.prompt_ids
        return {
            "id": "chatcmpl-" + uuid.uuid4().hex, "object": "chat.completion",
            "created": int(time.time()), "model": self.model,
            "prompt_token_ids": prompt,
            "choices": [{"index": 0, "message": parsed.as_message(),
                         "finish_reason": _finish(gen, parsed), "token_ids": gen.ids,
                         "logprobs": _logprobs(gen)}],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(gen.ids),
                      "total_tokens": len(prompt) + len(gen.ids)},
        }

    # -- Upstream -------------------------------------------------------------------

    async def chat(self, request: UpstreamRequest) -> UpstreamReply:
        """One non-streamed turn (see module docstring)."""
        body = request.body()
        plan = await self._plan(body, request)
        payload = encode_request(self.api, plan.prompt_ids, self._sampling(body),
                                 model=self.model, stream=False)
        data = await self._post(payload)
        gen = decode_response(self.api, data)
        text = self.builder.tok.decode(gen.ids)
        parsed = parse_completion(text, self.builder.family,
                                  think_opened=self._think_opened(plan))
        await self._commit(plan, parsed, gen, request)
        return UpstreamReply(self._reply(plan, parsed, gen), None, None)

    async def _post(self, payload: dict[str, Any]) -> Any:
        try:
            async with self._http_client().post(self._url(), data=orjson.dumps(payload),
                                                headers={"Content-Type": "application/json"}
                                                ) as resp:
                raw = await resp.read()
                status = resp.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise UpstreamShapeError(f"model server unreachable: {exc}") from exc
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise UpstreamShapeError(f"model server answered non-JSON ({status})") from exc
        if status >= 400:
            raise UpstreamShapeError(error_message(data) or f"model server error {status}",
                                     status if status < 500 else 502)
        return data

    async def stream_chat(self, request: UpstreamRequest) -> AsyncIterator[StreamChunk]:
        """One streamed turn: text relayed as the server streams, tool calls once parsed,
        each chunk carrying its ``token_ids`` and logprobs; prompt ids on the first."""
        body = request.body()
        plan = await self._plan(body, request)
        cid = "chatcmpl-" + uuid.uuid4().hex
        if self.api is UpstreamApi.GENERATE:
            # Asked whole (its streamed shape is not documented), relayed as one chunk.
            gen = decode_response(self.api, await self._post(encode_request(
                self.api, plan.prompt_ids, self._sampling(body), model=self.model)))
            parsed = parse_completion(self.builder.tok.decode(gen.ids), self.builder.family,
                                      think_opened=self._think_opened(plan))
            await self._commit(plan, parsed, gen, request)
            msg = parsed.as_message()
            delta = {k: v for k, v in msg.items() if v is not None}
            if "tool_calls" in delta:
                delta["tool_calls"] = [{"index": i, **tc}
                                       for i, tc in enumerate(delta["tool_calls"])]
            yield self._chunk(cid, delta, gen.ids, gen.logprobs, _finish(gen, parsed),
                              plan.prompt_ids, usage=self._reply(plan, parsed, gen)["usage"])
            return
        payload = encode_request(self.api, plan.prompt_ids, self._sampling(body),
                                 model=self.model, stream=True)
        dec = StreamDecoder(self.api)
        detok = IncrementalDecoder(self.builder.tok)
        parser = StreamParser(self.builder.family, think_opened=self._think_opened(plan))
        first = True
        n_calls = 0
        try:
            async with self._http_client().post(self._url(), data=orjson.dumps(payload),
                                                headers={"Content-Type": "application/json"}
                                                ) as resp:
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
                        break
                    try:
                        obj = orjson.loads(data)
                    except orjson.JSONDecodeError as exc:
                        raise UpstreamShapeError("model server streamed malformed JSON") \
                            from exc
                    piece = dec.feed(obj)
                    if len(piece.logprobs) != len(piece.ids):
                        raise UpstreamShapeError("streamed chunk: logprob count differs "
                                                 "from its token count; not recorded")
                    events = parser.feed(detok.add(piece.ids))
                    delta, n_calls = _delta(events, n_calls)
                    if first:
                        delta.setdefault("role", "assistant")
                    yield self._chunk(cid, delta, piece.ids, piece.logprobs, None,
                                      plan.prompt_ids if first else None)
                    first = False
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise UpstreamShapeError(f"model server stream broke: {exc}") from exc
        gen = dec.finish()
        events = parser.close()
        delta, n_calls = _delta(events, n_calls)
        await self._commit(plan, parser.result, gen, request)
        yield self._chunk(cid, delta, [], [], _finish(gen, parser.result),
                          plan.prompt_ids if first else None,
                          usage={"prompt_tokens": plan.point.length,
                                 "completion_tokens": len(gen.ids),
                                 "total_tokens": plan.point.length + len(gen.ids)})

    def _chunk(self, cid: str, delta: dict[str, Any], ids: list[int], lps: list[float],
               finish: str | None, prompt: list[int] | None,
               usage: dict[str, int] | None = None) -> StreamChunk:
        ch: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish,
                              "token_ids": ids,
                              "logprobs": {"content": [
                                  {"token": f"token_id:{i}", "logprob": lp, "bytes": None,
                                   "top_logprobs": []}
                                  for i, lp in zip(ids, lps, strict=True)]}}
        d: dict[str, Any] = {"id": cid, "object": "chat.completion.chunk",
                             "created": int(time.time()), "model": self.model,
                             "choices": [ch]}
        if prompt is not None:
            d["prompt_token_ids"] = prompt
        if usage is not None:
            d["usage"] = usage
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
        return {"tito_mismatch": int(rep["mismatch"]), "tito": tito}

    async def count_tokens(self, body: dict[str, Any]) -> int:
        """Prompt tokens of ``body`` as a full render (the template, not the bridge)."""
        r = await asyncio.to_thread(self.builder.render_full, body.get("messages") or [],
                                    body.get("tools"))
        return len(r.ids)


def _delta(events: list[Any], n_calls: int) -> tuple[dict[str, Any], int]:
    delta: dict[str, Any] = {}
    for e in events:
        if e.kind == "content":
            delta["content"] = delta.get("content", "") + e.text
        elif e.kind == "reasoning":
            delta["reasoning_content"] = delta.get("reasoning_content", "") + e.text
        elif e.call is not None:
            delta.setdefault("tool_calls", []).append({"index": n_calls, **e.call.as_openai()})
            n_calls += 1
    return delta, n_calls


def _as_upstream_error(exc: Exception) -> UpstreamShapeError:
    # The Upstream contract: every failure is an UpstreamError carrying the status to answer
    # (400 for a template failure, 409 for extending a length-cut turn).
    return UpstreamShapeError(str(exc), int(getattr(exc, "status", 400)))
