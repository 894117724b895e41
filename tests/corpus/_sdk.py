"""Corpus case of real SDK turns through the proxy: chat completions, Responses, Anthropic
messages, streamed and not; the session API's sample payloads and in-process samples."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ._runs import Corpus, det, run_files
from ._tap import UpstreamTap

__all__ = ["SDK_CASES", "sdk_records"]


async def _chat(client: Any, model: str, stream: bool) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 2 + 3?"}]
    for turn in range(2):
        kw: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": 12,
                              "temperature": 1.0, "seed": 11 + turn}
        if stream:
            text = ""
            async for chunk in await client.chat.completions.create(stream=True, **kw):
                if chunk.choices and chunk.choices[0].delta.content:
                    text += chunk.choices[0].delta.content
        else:
            reply = await client.chat.completions.create(**kw)
            text = reply.choices[0].message.content or ""
        messages += [{"role": "assistant", "content": text},
                     {"role": "user", "content": "And 4 * 4?"}]


def _tool_schemas() -> list[dict[str, Any]]:
    from tracewire.env.bundled import tools

    data = Path(tools.__file__).with_name("data") / "tool_schemas.json"
    schemas: list[dict[str, Any]] = json.loads(data.read_text("utf-8"))
    return schemas


async def _chat_tools(client: Any, model: str) -> None:
    # A tool call streamed back (the built-in model learned the tools environment's turns),
    # its result, and the streamed answer after it.
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You can call tools. Use a tool to compute the result, "
                                      "then reply with 'Answer: <number>'."},
        {"role": "user", "content": "Use the calculator to compute (12 * 7) + 5."}]
    for turn in range(2):
        text, calls = "", {}
        async for chunk in await client.chat.completions.create(
                model=model, messages=messages, tools=_tool_schemas(), max_tokens=48,
                temperature=0.0, seed=5 + turn, stream=True,
                stream_options={"include_usage": True}):
            if not chunk.choices:
                continue
            d = chunk.choices[0].delta
            text += d.content or ""
            for tc in d.tool_calls or []:
                c = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                c["id"] += tc.id or ""
                c["name"] += (tc.function.name or "") if tc.function else ""
                c["arguments"] += (tc.function.arguments or "") if tc.function else ""
        msg: dict[str, Any] = {"role": "assistant", "content": text or None}
        if calls:
            msg["tool_calls"] = [{"id": c["id"], "type": "function", "function": {
                "name": c["name"], "arguments": c["arguments"]}} for c in calls.values()]
        messages.append(msg)
        for c in calls.values():
            messages.append({"role": "tool", "tool_call_id": c["id"], "content": "89"})
        if not calls:
            messages.append({"role": "user", "content": "Check it with the calculator."})


async def _responses_stream(client: Any, model: str) -> None:
    items: list[Any] = [{"role": "user", "content": "Name a colour."}]
    for _ in range(2):
        async with client.responses.stream(model=model, input=items, max_output_tokens=10,
                                           temperature=1.0) as s:
            final = await s.get_final_response()
        items += [o.model_dump(exclude_none=True) for o in final.output]
        items.append({"role": "user", "content": "Another."})


async def _responses(client: Any, model: str) -> None:
    first = await client.responses.create(model=model, input="Say hi.", max_output_tokens=10,
                                          temperature=1.0)
    items: list[Any] = [{"role": "user", "content": "Say hi."}]
    items += [o.model_dump(exclude_none=True) for o in first.output]
    items.append({"role": "user", "content": "Again."})
    await client.responses.create(model=model, input=items, max_output_tokens=10,
                                  temperature=1.0)


async def _messages(client: Any, model: str) -> None:
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "Count to three."}]
    first = await client.messages.create(model=model, max_tokens=10, messages=msgs,
                                         system="Be brief.")
    msgs += [{"role": "assistant", "content": [b.model_dump(exclude_none=True)
                                               for b in first.content]},
             {"role": "user", "content": "Now to four."}]
    async with client.messages.stream(model=model, max_tokens=10, messages=msgs,
                                      system="Be brief.") as s:
        await s.get_final_message()


#: One session each: which SDK and API, streamed or not.
SDK_CASES = ["chat", "chat-stream", "chat-tools-stream", "responses", "responses-stream",
             "anthropic"]


async def sdk_records(work: Path, out: Corpus) -> None:
    import aiohttp
    import anthropic
    import openai

    from tracewire.model import MODEL_NAME, ModelServer
    from tracewire.proxy import Proxy, ProxyConfig
    from tracewire.samples import assemble, encode_samples
    from tracewire.sessions import SessionClient
    from tracewire.store import Run
    from tracewire.trace import Episode

    token = "tws-corpus-token"
    model = ModelServer.run_in_thread(seed=0)
    det.reseed("sdk")
    run = await Run.create(work / "sdk", meta={"corpus": "sdk"})
    try:
        async with UpstreamTap(model.base_url) as tap, \
                Proxy(tap.base_url, config=ProxyConfig(session_token=token)) as proxy, \
                SessionClient(proxy.url, token=token) as trainer, aiohttp.ClientSession(
                    headers={"Authorization": f"Bearer {token}"}) as http:
            port = proxy.url.encode()
            for case in SDK_CASES:
                det.reseed(f"sdk/{case}")
                # The session API's own answers, as bytes (the proxy's port written as
                # {proxy}: the one value of them that is not fixed).
                async with http.post(proxy.url + "/sessions", json={
                        "metadata": {"case": case}, "group_id": f"g-{case}"}) as r:
                    raw = await r.read()
                    assert r.status == 201, raw
                out[f"sessions/{case}.create.json"] = raw.replace(port, b"{proxy}")
                info = json.loads(raw)
                sid = _field(info, "id", "session_id")
                secret = _field(info, "secret", "api_key")
                if case == "anthropic":
                    a = anthropic.AsyncAnthropic(base_url=_field(info, "anthropic_base_url"),
                                                 api_key=secret, max_retries=0)
                    await _messages(a, MODEL_NAME)
                    await a.close()
                else:
                    o = openai.AsyncOpenAI(base_url=_field(info, "base_url"), api_key=secret,
                                           max_retries=0)
                    if case == "responses":
                        await _responses(o, MODEL_NAME)
                    elif case == "responses-stream":
                        await _responses_stream(o, MODEL_NAME)
                    elif case == "chat-tools-stream":
                        await _chat_tools(o, MODEL_NAME)
                    else:
                        await _chat(o, MODEL_NAME, stream=case == "chat-stream")
                    await o.close()
                async with http.get(f"{proxy.url}/sessions/{sid}") as r:
                    out[f"sessions/{case}.summary.json"] = await r.read()
                # What a trainer reads: the session API's sample payloads, whole and cut.
                out[f"samples/http/{case}.safetensors"] = await trainer.payload(sid)
                out[f"samples/http/{case}-cut16.safetensors"] = await trainer.payload(
                    sid, max_seq_len=16, metadata={"step": 3})
                trace = proxy.registry.get(sid).trace
                episode = Episode(f"sdk-{case}", env="corpus-sdk", task_key=case,
                                  task={"case": case}, group_id=f"g-{case}", traces=[trace])
                await run.append(episode)
                # compute -> truncate -> merge in process, encoded with the codec.
                out[f"samples/local/{case}.safetensors"] = encode_samples(assemble(trace))
                out[f"samples/local/{case}-cut24.safetensors"] = encode_samples(
                    assemble(trace, max_seq_len=24), info={"case": case})
                async with http.delete(f"{proxy.url}/sessions/{sid}") as r:
                    out[f"sessions/{case}.delete.json"] = await r.read()
        out["upstream/sdk.reqs"] = tap.frames()
    finally:
        await run.close()
        model.stop()
    run_files("records/sdk", work / "sdk", out)


def _field(info: dict[str, Any], *names: str) -> str:
    # The session fields may be renamed (SessionInfo's id/secret): take the first present.
    for n in names:
        v = info.get(n)
        if v is not None:
            return str(v)
    raise KeyError(f"the session answer has none of {names}: {sorted(info)}")
