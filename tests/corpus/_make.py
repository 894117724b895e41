"""Generate the byte corpus: stored records, env-server wire frames and sample payloads.

``python -m tests.corpus._make --out DIR`` writes the corpus of the code on ``PYTHONPATH``
into ``DIR``; ``--write`` replaces the golden files (``tests/corpus/golden/``, see its README)
and ``--check`` compares against them (what ``test_corpus.py`` does). Everything runs in this
one process on real parts: the built-in model on a loopback port (its own thread), the
interception proxy, the OpenAI and Anthropic SDKs, ``evaluate`` into real run directories,
an env server (stand-in environment, inline worker) spoken to over a real TCP socket, the
session API over HTTP. The only normalisation is ``_determinism`` (fixed clock, seeded ids).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sqlite3
import sys
import tempfile
from pathlib import Path
from typing import Any

from . import _determinism as det

det.install()  # before tracewire is imported anywhere in this process

import msgspec  # noqa: E402

from ._files import GOLDEN, read_dir, write_dir  # noqa: E402

#: name -> bytes of one corpus file (names are paths inside the corpus directory).
Corpus = dict[str, bytes]


# -- records: runs written by evaluate -------------------------------------------------------
#: (case, environment, seed, tasks, rollouts per task)
EVAL_CASES = [
    ("arithmetic-s0", "arithmetic", 0, 3, 1),
    ("arithmetic-s5", "arithmetic", 5, 2, 2),
    ("guess-s0", "guess", 0, 2, 1),
    ("guess-s3", "guess", 3, 2, 1),
    ("tools-s0", "tools", 0, 3, 1),
    ("tools-s9", "tools", 9, 2, 1),
]


def index_rows(run_dir: Path) -> bytes:
    """The run's index rows as the store wrote them (every column, ``row_crc`` included)."""
    con = sqlite3.connect(f"file:{run_dir / 'index.sqlite'}?mode=ro", uri=True)
    try:
        cur = con.execute("SELECT * FROM episodes ORDER BY seq")
        names = [d[0] for d in cur.description]
        rows = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
    finally:
        con.close()
    return json.dumps(rows, indent=1, sort_keys=True).encode() + b"\n"


def run_files(prefix: str, run_dir: Path, out: Corpus) -> None:
    """A closed run's segment files (raw bytes) and index rows (JSON)."""
    for seg in sorted((run_dir / "segments").iterdir()):
        out[f"{prefix}/segments/{seg.name}"] = seg.read_bytes()
    out[f"{prefix}/index.json"] = index_rows(run_dir)


async def eval_records(work: Path, out: Corpus) -> None:
    from tracewire.compose import evaluate
    from tracewire.model import ModelServer

    for case, env, seed, n, r in EVAL_CASES:
        model = ModelServer.run_in_thread(seed=seed)
        try:
            det.reseed(f"records/{case}")
            result = await evaluate(env, base_url=model.base_url, n=n, r=r, seed=seed,
                                    concurrency=1, out=work / case)
        finally:
            model.stop()
        if result.status != "complete":
            raise RuntimeError(f"{case}: eval ended {result.status} ({result.reason})")
        run_files(f"records/{case}", work / case, out)


#: (case, environment, seed, tasks, tokenizer family, token-in API): the proxy answering
#: token-in/token-out through tito over the built-in model serving that fixture tokenizer.
TITO_CASES = [
    ("tito-tools-qwen25", "tools", 0, 2, "qwen25", "completions"),
    ("tito-guess-llama3", "guess", 1, 1, "llama3", "generate"),
]


#: The ``command`` environment's agent is a subprocess: its pid, the interpreter's path and
#: the random workdir name are recorded in ``trace.info["command"]``. Those three, and the
#: index columns computed from the header bytes (``crc``, ``row_crc``, ``length``,
#: ``offset``), are the only values scrubbed in the corpus; everything else of these
#: records (every other header field, every token buffer) is compared as written.
COMMAND_CASE = ("command-s0", "command", 0, 3)
_SCRUBBED_COLUMNS = ("crc", "row_crc", "length", "offset")


def _scrub(tree: Any, workdir: re.Pattern[str]) -> Any:
    if isinstance(tree, dict):
        out = {k: _scrub(v, workdir) for k, v in tree.items()}
        if isinstance(out.get("command"), dict) and "pid" in out["command"]:
            out["command"] = {**out["command"], "pid": "{pid}"}
        return out
    if isinstance(tree, list):
        return [_scrub(v, workdir) for v in tree]
    if isinstance(tree, str):
        return workdir.sub("{workdir}", tree.replace(sys.executable, "{python}"))
    return tree


async def command_records(work: Path, out: Corpus) -> None:
    from tracewire.compose import evaluate
    from tracewire.model import ModelServer

    from ._compare import split_record, split_segment

    case, env, seed, n = COMMAND_CASE
    model = ModelServer.run_in_thread(seed=seed)
    try:
        det.reseed(f"records/{case}")
        result = await evaluate(env, base_url=model.base_url, n=n, seed=seed, concurrency=1,
                                out=work / case)
    finally:
        model.stop()
    if result.status != "complete":
        raise RuntimeError(f"{case}: eval ended {result.status} ({result.reason})")
    workdir = re.compile(re.escape(tempfile.gettempdir()) + r"/tracewire-cmd-[A-Za-z0-9_]+")
    records = []
    for seg in sorted((work / case / "segments").iterdir()):
        for rec in split_segment(seg.read_bytes()):
            schema, header, bufs = split_record(rec)
            records.append([schema, _scrub(msgspec.msgpack.decode(header), workdir), bufs])
    out[f"records-scrubbed/{case}/records.msgpack"] = msgspec.msgpack.encode(records)
    rows = json.loads(index_rows(work / case))
    for row in rows:
        row.update(dict.fromkeys(_SCRUBBED_COLUMNS, "{scrubbed}"))
    out[f"records-scrubbed/{case}/index.json"] = (
        json.dumps(rows, indent=1, sort_keys=True).encode() + b"\n")


async def tito_records(work: Path, out: Corpus) -> None:
    from tracewire.compose import evaluate
    from tracewire.model import ModelServer
    from tracewire.tito.fixtures import build_tokenizer_dir

    for case, env, seed, n, family, api in TITO_CASES:
        tok = build_tokenizer_dir(work / f"tok-{family}", family)
        model = ModelServer.run_in_thread(seed=seed, tokenizer=tok, non_canonical=0.5)
        try:
            det.reseed(f"records/{case}")
            result = await evaluate(env, base_url=model.base_url, n=n, seed=seed,
                                    concurrency=1, out=work / case, tokenizer=str(tok),
                                    upstream_api=api)
        finally:
            model.stop()
        if result.status != "complete":
            raise RuntimeError(f"{case}: eval ended {result.status} ({result.reason})")
        run_files(f"records/{case}", work / case, out)


# -- records and payloads of SDK turns through the proxy -------------------------------------
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
        async with Proxy(model.base_url, config=ProxyConfig(session_token=token)) as proxy, \
                SessionClient(proxy.url, token=token) as trainer:
            for case in SDK_CASES:
                det.reseed(f"sdk/{case}")
                info = await trainer.create(metadata={"case": case}, group_id=f"g-{case}")
                sid = _field(info, "session_id", "id")
                secret = _field(info, "api_key", "secret")
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
                await trainer.delete(sid)
    finally:
        await run.close()
        model.stop()
    run_files("records/sdk", work / "sdk", out)


def _field(info: Any, *names: str) -> str:
    # SessionInfo's field names are being renamed; accept the old and the new one.
    for n in names:
        v = getattr(info, n, None)
        if v is not None:
            return str(v)
    raise AttributeError(f"SessionInfo has none of {names}")


def eval_samples(work: Path, out: Corpus) -> None:
    """Samples of the stored eval episodes (read back from their records)."""
    from tracewire.samples import assemble, encode_samples
    from tracewire.store import open_run

    for case, *_ in EVAL_CASES + TITO_CASES:
        run = open_run(work / case)
        for k, ep in enumerate(run.episodes()):
            for j, trace in enumerate(ep.traces):
                got = assemble(trace, max_seq_len=64, group_id=ep.group_id,
                               group_index=ep.group_index, metadata={"task": ep.task_key})
                out[f"samples/eval/{case}-{k}-{j}.safetensors"] = encode_samples(got)


# -- wire frames: the env server, spoken to over a raw DEALER socket --------------------------
#: (case, run body): stand-in turns paced well past the streamer's poll (0.05 s) and
#: coalescing (0.002 s) timers, so each turn is exactly one delta whatever the load.
WIRE_CASES: list[tuple[str, dict[str, Any]]] = [
    ("standin-stream", {"task": {"key": "a", "turns": 3, "tokens": 24, "delay": 0.15},
                        "stream": True}),
    ("standin-stream-b", {"task": {"key": "b", "turns": 2, "tokens": 5, "delay": 0.15},
                          "stream": True}),
    ("standin-episode", {"task": {"key": "c", "turns": 4, "tokens": 40},
                         "stream": False, "keep_frames": True}),
]


async def wire_frames(work: Path, out: Corpus) -> None:
    import zmq
    import zmq.asyncio

    from tracewire.serve import PROTOCOL_VERSION, EnvServer, InlinePool, ServerConfig
    from tracewire.store import Run
    from tracewire.trace import SCHEMA_VERSION

    server = EnvServer("standin", address="tcp://127.0.0.1:0",
                       config=ServerConfig(curve=False), pool=InlinePool())
    await server.start()
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    run = await Run.create(work / "wire", meta={"corpus": "wire"})
    try:
        await server.wait_ready(timeout=60)
        sock.connect(server.address)
        det.reseed("wire")
        for case, body in WIRE_CASES:
            det.reseed(f"wire/{case}")
            rid = f"rid-{case}"
            await sock.send_multipart([msgspec.msgpack.encode(
                [PROTOCOL_VERSION, SCHEMA_VERSION, "run", rid, body])])
            messages: list[list[bytes]] = []
            while True:
                frames = await asyncio.wait_for(sock.recv_multipart(), 30)
                messages.append(frames)
                kind = msgspec.msgpack.decode(frames[0])[2]
                if kind in ("reply", "error"):
                    break
            if kind == "error":
                raise RuntimeError(f"{case}: {msgspec.msgpack.decode(frames[0])}")
            out[f"wire/{case}.msgs"] = msgspec.msgpack.encode(messages)
            if body.get("keep_frames"):
                await run.append_frames(messages[-1][1:])  # stored as received
    finally:
        await run.close()
        sock.close()
        ctx.term()
        await server.stop(drain=False, timeout=5)
    run_files("records/wire", work / "wire", out)


# -- driving ----------------------------------------------------------------------------------
def _import_everything() -> None:
    # Libraries may draw an id when imported (huggingface_hub does): import them all before
    # the first case, so where the code under test first imports one moves no id.
    import importlib

    for name in ("aiohttp", "anthropic", "openai", "zmq", "zmq.asyncio", "safetensors.numpy",
                 "transformers", "tokenizers", "jinja2", "huggingface_hub", "tracewire",
                 "tracewire.compose", "tracewire.env.bundled", "tracewire.model",
                 "tracewire.proxy", "tracewire.samples", "tracewire.serve",
                 "tracewire.sessions", "tracewire.store", "tracewire.tito",
                 "tracewire.tito.fixtures"):
        importlib.import_module(name)


async def generate() -> Corpus:
    _import_everything()
    out: Corpus = {}
    with tempfile.TemporaryDirectory(prefix="tw-corpus-") as tmp:
        work = Path(tmp)
        await eval_records(work, out)
        await tito_records(work, out)
        await command_records(work, out)
        eval_samples(work, out)
        await sdk_records(work, out)
        await wire_frames(work, out)
    return dict(sorted(out.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.corpus._make")
    g = parser.add_mutually_exclusive_group(required=True)
    g.add_argument("--out", type=Path, help="write the corpus into this directory")
    g.add_argument("--write", action="store_true", help="replace the golden files")
    g.add_argument("--check", action="store_true", help="compare with the golden files")
    args = parser.parse_args(argv)
    corpus = asyncio.run(generate())
    if args.check:
        from ._compare import compare

        problems = compare(read_dir(GOLDEN), corpus)
        print("\n".join(problems) if problems else f"corpus identical ({len(corpus)} files)")
        return 1 if problems else 0
    target = GOLDEN if args.write else args.out
    write_dir(corpus, target)
    print(f"wrote {len(corpus)} files ({sum(map(len, corpus.values()))} bytes) to {target}")
    return 0



if __name__ == "__main__":
    raise SystemExit(main())
