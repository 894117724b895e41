"""Corpus case of the proxy's answers as a harness receives them: raw HTTP bodies (JSON and
server-sent events) of chat completions, Responses and Anthropic messages turns, streamed
and not, sent without an SDK, and the records of those sessions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ._runs import Corpus, det, run_files
from ._tap import UpstreamTap

__all__ = ["http_records"]

#: (case, route under the session's /v1, request bodies of its turns). A turn's body may
#: hold ``"{answer}"``: the previous turn's answer text, filled in from its JSON reply.
_TURNS: list[tuple[str, str, list[dict[str, Any]]]] = [
    ("chat", "chat/completions", [
        {"messages": [{"role": "user", "content": "What is 3 + 4?"}], "max_tokens": 10,
         "seed": 1, "logprobs": True},
        {"messages": [{"role": "user", "content": "What is 3 + 4?"},
                      {"role": "assistant", "content": "{answer}"},
                      {"role": "user", "content": "And 5 + 6?"}], "max_tokens": 10,
         "seed": 2, "stream": True, "stream_options": {"include_usage": True}},
    ]),
    ("responses", "responses", [
        {"input": "Name a number.", "max_output_tokens": 8, "temperature": 1.0},
        {"input": "Name another number.", "max_output_tokens": 8, "stream": True},
    ]),
    ("messages", "messages", [
        {"messages": [{"role": "user", "content": "Say one word."}], "max_tokens": 8,
         "system": "Be brief."},
        {"messages": [{"role": "user", "content": "Say one word."},
                      {"role": "assistant", "content": "{answer}"},
                      {"role": "user", "content": "Another."}], "max_tokens": 8,
         "system": "Be brief.", "stream": True},
    ]),
]


def _answer(route: str, body: bytes) -> str:
    d = json.loads(body)
    if route == "chat/completions":
        return str(d["choices"][0]["message"]["content"] or "")
    if route == "messages":
        return "".join(b.get("text", "") for b in d["content"])
    return ""


def _fill(value: Any, answer: str) -> Any:
    if isinstance(value, dict):
        return {k: _fill(v, answer) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, answer) for v in value]
    return answer if value == "{answer}" else value


async def http_records(work: Path, out: Corpus) -> None:
    import aiohttp

    from tracewire.model import MODEL_NAME, ModelServer
    from tracewire.proxy import Proxy, ProxyConfig
    from tracewire.store import Run
    from tracewire.trace import Episode

    token = "tws-corpus-token"
    model = ModelServer.run_in_thread(seed=4)
    run = await Run.create(work / "http", meta={"corpus": "http"})
    try:
        async with UpstreamTap(model.base_url) as tap, \
                Proxy(tap.base_url, config=ProxyConfig(session_token=token)) as proxy, \
                aiohttp.ClientSession() as http:
            for case, route, turns in _TURNS:
                det.reseed(f"http/{case}")
                async with http.post(proxy.url + "/sessions", json={"group_id": case},
                                     headers={"Authorization": f"Bearer {token}"}) as r:
                    session = await r.json()
                sid = session.get("id") or session["session_id"]
                secret = session.get("secret") or session["api_key"]
                headers = {"Authorization": f"Bearer {secret}", "x-api-key": secret,
                           "anthropic-version": "2023-06-01"}
                answer = ""
                for i, body in enumerate(turns):
                    body = {"model": MODEL_NAME, **_fill(body, answer)}
                    async with http.post(f"{proxy.url}/sessions/{sid}/v1/{route}",
                                         json=body, headers=headers) as r:
                        got = await r.read()
                        head = f"{r.status} {r.content_type}\n\n".encode()
                    out[f"http/{case}-{i}.http"] = head + got
                    if not body.get("stream"):
                        answer = _answer(route, got)
                trace = proxy.registry.get(sid).trace
                await run.append(Episode(f"http-{case}", env="corpus-http", task_key=case,
                                         traces=[trace]))
        out["upstream/http.reqs"] = tap.frames()
    finally:
        await run.close()
        model.stop()
    run_files("records/http", work / "http", out)
