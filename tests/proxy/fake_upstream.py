"""A fake OpenAI-compatible upstream replaying vLLM and SGLang response shapes.

Its "tokenizer" renders each message as [role id] + UTF-8 bytes (+1000) + [END], so a later
turn's prompt extends the earlier prompt + completion exactly, as a real chat template does
when it is consistent. Every answer it gives is kept in ``log`` for the tests to compare.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

END = 2
ROLES = {"system": 10, "user": 11, "assistant": 12, "tool": 13}


def _text_of(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content if p.get("type") == "text")


def encode(text: str) -> list[int]:
    return [1000 + b for b in text.encode()]


def assistant_body(content: str | None, calls: list[tuple[str, str]]) -> list[int]:
    ids = encode(content or "")
    for name, args in calls:
        ids += encode(f"<tool>{name}:{args}</tool>")
    return [*ids, END]


def render(messages: list[dict[str, Any]]) -> list[int]:
    ids: list[int] = []
    for m in messages:
        ids.append(ROLES[m["role"]])
        if m["role"] == "assistant":
            calls = [(tc["function"]["name"], tc["function"]["arguments"])
                     for tc in m.get("tool_calls") or ()]
            ids += assistant_body(m.get("content"), calls)
        else:
            ids += [*encode(_text_of(m.get("content"))), END]
    return [*ids, ROLES["assistant"]]


def logprob(i: int, tid: int) -> float:
    return -((tid * 7 + i) % 97) / 64.0


@dataclass
class Turn:
    prompt: list[int]
    completion: list[int]
    logprobs: list[float]
    content: str | None
    calls: list[tuple[str, str, str]]


@dataclass
class Fake:
    """Mode: 'vllm' or 'sglang' or 'none' (no token fields at all)."""

    mode: str = "vllm"
    log: list[Turn] = field(default_factory=list)
    fail_next: int = 0  # answer this many requests with 500
    delay: float = 0.0
    stall: float = 0.0  # pause mid-stream (keepalive tests)
    requests: list[dict[str, Any]] = field(default_factory=list)

    def answer(self, req: dict[str, Any]) -> Turn:
        msgs = req["messages"]
        prompt = render(msgs)
        n_tool = sum(1 for m in msgs if m["role"] == "tool")
        tools = req.get("tools") or []
        last = _text_of(msgs[-1].get("content"))
        calls: list[tuple[str, str, str]] = []
        content: str | None
        if tools and n_tool < 5:
            name = tools[0]["function"]["name"]
            args = orjson.dumps({"a": n_tool, "b": len(msgs)}).decode()
            calls = [(f"call_{len(self.log)}_{n_tool}", name, args)]
            content = None if n_tool % 2 else f"calling {name}"
        else:
            content = f"echo[{len(msgs)}]: {last[:40]}"
        completion = assistant_body(content, [(n, a) for _, n, a in calls])
        lps = [logprob(i, t) for i, t in enumerate(completion)]
        turn = Turn(prompt, completion, lps, content, calls)
        self.log.append(turn)
        return turn

    def _choice_extra(self, turn: Turn, want_ids: bool, want_lp: bool) -> dict[str, Any]:
        ex: dict[str, Any] = {}
        if self.mode == "vllm":
            ex["token_ids"] = turn.completion if want_ids else None
            ex["logprobs"] = {"content": [
                {"token": chr(t - 1000) if t >= 1000 else "<end>", "logprob": lp,
                 "bytes": [], "top_logprobs": []}
                for t, lp in zip(turn.completion, turn.logprobs, strict=True)]} if want_lp else None
        elif self.mode == "sglang":
            ex["logprobs"] = None
            ex["meta_info"] = {"output_token_logprobs": [
                [lp, t, None] for t, lp in zip(turn.completion, turn.logprobs, strict=True)]}
        return ex

    async def chat(self, request: web.Request) -> web.StreamResponse:
        req = await request.json()
        self.requests.append(req)
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.fail_next:
            self.fail_next -= 1
            return web.json_response({"error": {"message": "fake upstream exploded",
                                                "type": "server_error"}}, status=500)
        turn = self.answer(req)
        want_ids = bool(req.get("return_token_ids"))
        want_lp = bool(req.get("logprobs"))
        msg: dict[str, Any] = {"role": "assistant", "content": turn.content}
        if turn.calls:
            msg["tool_calls"] = [{"id": i, "type": "function",
                                  "function": {"name": n, "arguments": a}}
                                 for i, n, a in turn.calls]
        finish = "tool_calls" if turn.calls else "stop"
        usage = {"prompt_tokens": len(turn.prompt), "completion_tokens": len(turn.completion),
                 "total_tokens": len(turn.prompt) + len(turn.completion)}
        top: dict[str, Any] = {"id": "chatcmpl-fake", "object": "chat.completion",
                               "created": 1700000000, "model": "fake-model"}
        if not req.get("stream"):
            choice = {"index": 0, "message": msg, "finish_reason": finish,
                      **self._choice_extra(turn, want_ids, want_lp)}
            body: dict[str, Any] = {**top, "choices": [choice], "usage": usage}
            if self.mode == "vllm":
                body["prompt_token_ids"] = turn.prompt if want_ids else None
            elif self.mode == "sglang":
                body["input_ids"] = turn.prompt
            return web.json_response(body)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        top["object"] = "chat.completion.chunk"

        async def send(d: dict[str, Any]) -> None:
            await resp.write(b"data: " + orjson.dumps(d) + b"\n\n")

        first: dict[str, Any] = {**top, "choices": [{"index": 0, "delta": {"role": "assistant",
                                                                             "content": ""}}]}
        if self.mode == "vllm" and want_ids:
            first["prompt_token_ids"] = turn.prompt
        if self.mode == "sglang":
            first["input_ids"] = turn.prompt
        await send(first)
        # One chunk per token; the text of content tokens, then tool-call pieces.
        text_len = len(encode(turn.content or ""))
        for i, tid in enumerate(turn.completion):
            if self.stall and i == 2:
                await asyncio.sleep(self.stall)
            delta: dict[str, Any] = {}
            if i < text_len:
                delta["content"] = chr(tid - 1000)
            ex = self._choice_extra(Turn([], [tid], [turn.logprobs[i]], None, []),
                                    want_ids, want_lp)
            ch = {"index": 0, "delta": delta, **ex}
            await send({**top, "choices": [ch]})
        for k, (cid, name, args) in enumerate(turn.calls):
            await send({**top, "choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": k, "id": cid, "type": "function",
                 "function": {"name": name, "arguments": ""}}]}}]})
            for piece in (args[: len(args) // 2], args[len(args) // 2:]):
                await send({**top, "choices": [{"index": 0, "delta": {"tool_calls": [
                    {"index": k, "function": {"arguments": piece}}]}}]})
        await send({**top, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
        if (req.get("stream_options") or {}).get("include_usage"):
            await send({**top, "choices": [], "usage": usage})
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": "fake-model", "object": "model", "created": 0, "owned_by": "fake"}]})

    def app(self) -> web.Application:
        app = web.Application(client_max_size=256 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/v1/models", self.models)
        return app


async def serve(fake: Fake) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(fake.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}/v1"
