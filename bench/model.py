"""Bench the built-in model: generation speed (engine and over HTTP) and start-up time.

    .venv/bin/python bench/model.py

Prints one JSON line per figure (bench "model", case "generate"); medians of RUNS runs.
There is no baseline: nothing we replace ships an embedded model.
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


def main() -> None:
    emit("tokens_per_s", "tokens/s", engine_tokens_per_s(), "higher")
    emit("http_tokens_per_s", "tokens/s", http_tokens_per_s(), "higher")
    emit("startup_s", "s", startup_s(), "lower")
    emit("in_process_start_s", "s", in_process_start_s(), "lower")


if __name__ == "__main__":
    main()
