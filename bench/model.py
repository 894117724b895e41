"""Bench the built-in model: generation speed (engine and over HTTP) and start-up time.

    .venv/bin/python bench/model.py             # every case
    .venv/bin/python bench/model.py token_in    # only the token-in case

Prints one JSON line per figure (bench "model"); medians of RUNS runs. Case "generate" has
no baseline: nothing we replace ships an embedded model. Case "token_in" measures
``/inference/v1/generate`` over loopback HTTP serving a fixture tokenizer directory (the
two-stage sampler of ``_foreign.py``) against the built-in vocabulary (the baseline) in the
same run.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time

import numpy as np

RUNS = 5
PROMPTS = ["What is the capital of France?", "Convert 12 km to mi.",
           "Sam has 37 apples and gets 48 more. How many apples does Sam have?",
           "I am thinking of a number from 1 to 100. You have 6 guesses. What is your first guess?",
           "Tell me a long story about a cactus and a goose."]


def emit(metric: str, unit: str, values: list[float], better: str) -> None:
    print(json.dumps({"bench": "model", "case": "generate", "metric": metric, "unit": unit,
                      "ours": round(statistics.median(values), 3), "baseline": None,
                      "ratio": None, "better": better, "runs": len(values)}), flush=True)


def engine_tokens_per_s() -> list[float]:
    from tracewire.model import ChatTemplate, get_engine
    from tracewire.model._engine import Generation, SamplingParams

    e = get_engine()
    tpl = ChatTemplate(e.tok)
    out = []
    for run in range(RUNS):
        n, t0 = 0, time.perf_counter()
        i = 0
        while n < 20_000:
            prompt = tpl.render([{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}])
            gen = Generation(e, prompt, SamplingParams(temperature=1.0, max_tokens=512),
                             np.random.default_rng([run, i]))
            while gen.step() is not None:
                pass
            n += len(gen.tokens)
            i += 1
        out.append(n / (time.perf_counter() - t0))
    return out


def http_tokens_per_s() -> list[float]:
    import openai

    from tracewire.model import ModelServer

    out = []
    with ModelServer.run_in_thread() as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="none")
        for run in range(RUNS):
            n, t0, i = 0, time.perf_counter(), 0
            while n < 10_000:
                r = client.chat.completions.create(
                    model="tracewire-tiny", seed=run * 1000 + i, max_tokens=512,
                    messages=[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}])
                n += r.usage.completion_tokens if r.usage else 0
                i += 1
            out.append(n / (time.perf_counter() - t0))
    return out


def startup_s() -> list[float]:
    """Cold start: a fresh ``tracewire model`` process until it prints its URL."""
    out = []
    for _ in range(RUNS):
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "tracewire", "model"],
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        out.append(time.perf_counter() - t0)
        proc.terminate()
        proc.wait()
        proc.stdout.close()
        assert line.startswith("http://")
    return out


def in_process_start_s() -> list[float]:
    """Model load + listen inside an already-running process (first load only is cold)."""
    import asyncio

    from tracewire.model import ModelServer, _engine, _ngram

    async def once() -> float:
        _engine._ENGINE.clear()
        _ngram._MODEL.clear()
        t0 = time.perf_counter()
        srv = ModelServer()
        await srv.start()
        dt = time.perf_counter() - t0
        await srv.stop()
        return dt

    return [asyncio.run(once()) for _ in range(RUNS)]


def token_in_ids_per_s() -> tuple[list[float], list[float]]:
    """Completion ids per second on ``/inference/v1/generate``: (foreign dir, built-in)."""
    import asyncio
    import tempfile

    import aiohttp

    from tracewire.model import ModelServer, render_chat
    from tracewire.tito import ChatTokenizer
    from tracewire.tito.fixtures import build_tokenizer_dir

    tok_dir = build_tokenizer_dir(tempfile.mkdtemp(), "qwen25")
    ct = ChatTokenizer(tok_dir)
    foreign_prompts = [ct.encode(ct.render([{"role": "user", "content": p}],
                                           add_generation_prompt=True)) for p in PROMPTS]
    builtin_prompts = [render_chat([{"role": "user", "content": p}]) for p in PROMPTS]

    async def rate(tokenizer: object, prompts: list[list[int]], run: int) -> float:
        async with ModelServer(tokenizer=tokenizer) as srv:  # type: ignore[arg-type]
            root = srv.base_url.removesuffix("/v1")
            async with aiohttp.ClientSession() as s:
                n, t0, i = 0, time.perf_counter(), 0
                while n < 5_000:
                    body = {"token_ids": prompts[i % len(prompts)],
                            "sampling_params": {"max_tokens": 512, "seed": run * 1000 + i,
                                                "logprobs": 0}}
                    async with s.post(f"{root}/inference/v1/generate", json=body) as r:
                        n += len((await r.json())["choices"][0]["token_ids"])
                    i += 1
                return n / (time.perf_counter() - t0)

    foreign = [asyncio.run(rate(tok_dir, foreign_prompts, r)) for r in range(RUNS)]
    builtin = [asyncio.run(rate(None, builtin_prompts, r)) for r in range(RUNS)]
    return foreign, builtin


def main() -> None:
    if sys.argv[1:] != ["token_in"]:
        generate_cases()
    foreign, builtin = token_in_ids_per_s()
    ours, base = statistics.median(foreign), statistics.median(builtin)
    print(json.dumps({"bench": "model", "case": "token_in", "metric": "ids_per_s",
                      "unit": "ids/s", "ours": round(ours, 1), "baseline": round(base, 1),
                      "ratio": round(ours / base, 3), "better": "higher", "runs": RUNS}),
          flush=True)


def generate_cases() -> None:
    """The "generate" case: engine and HTTP speed, start-up time."""
    emit("tokens_per_s", "tokens/s", engine_tokens_per_s(), "higher")
    emit("http_tokens_per_s", "tokens/s", http_tokens_per_s(), "higher")
    emit("startup_s", "s", startup_s(), "lower")
    emit("in_process_start_s", "s", in_process_start_s(), "lower")


if __name__ == "__main__":
    main()
