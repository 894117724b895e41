"""The composition root's options: the eval command line, the demo's preset, the backend
choice and the built-in model's context length."""

from __future__ import annotations

import argparse
import subprocess
import sys
import typing

import aiohttp
import pytest

import tracewire
from tracewire.cli import COMMANDS
from tracewire.compose import BACKENDS, EvalOptions, EvalResult, evaluate
from tracewire.compose._cli_demo import eval_args
from tracewire.compose._cli_eval import configure
from tracewire.compose._model_server import model_server


def eval_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    configure(parser)
    return parser


def test_eval_command_line_takes_every_evaluate_option() -> None:
    args = eval_parser().parse_args(
        ["guess", "--max-model-len", "4096", "--backend", "local", "--api-key", "k",
         "--max-tokens", "5", "-c", "3"]
    )
    assert (args.max_model_len, args.backend, args.api_key, args.max_tokens) == \
        (4096, "local", "k", 5)
    # Every option the command line forwards is an option of evaluate (a field of its plan).
    forwarded = {"model", "base_url", "api_key", "n", "r", "concurrency", "out", "resume",
                 "seed", "temperature", "max_tokens", "max_model_len", "backend"}
    assert forwarded <= set(typing.get_type_hints(EvalOptions))
    assert forwarded <= set(vars(args))
    with pytest.raises(SystemExit):
        eval_parser().parse_args(["guess", "--backend", "nowhere"])


def test_demo_is_the_eval_of_guess_with_a_preset() -> None:
    demo = argparse.Namespace(n=3, r=2, seed=7, out=None)
    args = eval_args(demo)
    assert (args.env, args.n, args.r, args.seed, args.concurrency) == ("guess", 3, 2, 7, 16)
    assert args.out is None and args.max_model_len is None and args.backend == "local"
    assert eval_args(argparse.Namespace(n=1, r=1, seed=0, out="x/y")).out == "x/y"


async def test_unknown_backend_is_refused_before_anything_starts() -> None:
    assert BACKENDS == ("local", "process", "ray")
    with pytest.raises(ValueError, match="unknown backend 'nowhere'"):
        await evaluate("guess", backend="nowhere")


def test_facade_evaluate_is_the_composition_roots() -> None:
    assert tracewire.evaluate is evaluate
    assert "run" in EvalResult.__dataclass_fields__


async def test_max_model_len_reaches_the_builtin_model() -> None:
    async with (
        model_server(None, None, None, max_model_len=1024) as (url, _model),
        aiohttp.ClientSession() as http,
        http.get(url + "/models") as resp,
    ):
        body = await resp.json()
    assert body["data"][0]["max_model_len"] == 1024


def test_help_lists_every_command() -> None:
    p = subprocess.run([sys.executable, "-m", "tracewire", "--help"], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    for name in COMMANDS:
        assert f"    {name} " in p.stdout, name
