"""The command line takes each part's public command object; compose wires proxy and serve."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from tracewire._command import Command, parse_worker_resources
from tracewire.cli import COMMANDS
from tracewire.compose import ENV_MODEL_OPTIONS, TOKEN_IN_UPSTREAM, env_factory


def test_every_command_is_a_public_command_named_as_listed() -> None:
    for name, load in COMMANDS.items():
        command = load()
        assert isinstance(command, Command) and command.name == name
        assert command.help and "\n" not in command.help


def test_proxy_and_serve_run_as_the_composition_root_wires_them() -> None:
    # The parts' own commands know no factory; the ones the CLI runs carry compose's.
    from tracewire.proxy import COMMAND as BARE_PROXY
    from tracewire.serve import COMMAND as BARE_SERVE

    proxy, serve = COMMANDS["proxy"](), COMMANDS["serve"]()
    assert proxy.run.keywords == {"upstream_options": TOKEN_IN_UPSTREAM}  # type: ignore[attr-defined]
    assert serve.run.keywords == {  # type: ignore[attr-defined]
        "default_factory": env_factory, "runner_options": ENV_MODEL_OPTIONS}
    assert BARE_PROXY.run.keywords == {"upstream_options": None}  # type: ignore[attr-defined]
    assert BARE_SERVE.run.keywords == {  # type: ignore[attr-defined]
        "default_factory": None, "runner_options": None}


def test_serve_of_a_real_env_without_a_factory_is_one_line_and_exit_2() -> None:
    # serve's bare command (no composition root): a real environment has no runner.
    code = ("import sys, argparse; from tracewire.serve import COMMAND as C; "
            "p = argparse.ArgumentParser(); C.configure(p); "
            "sys.exit(C.run(p.parse_args(['arithmetic', '--address', 'tcp://127.0.0.1:0'])))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 2, p.stderr
    assert "needs a runner factory" in p.stderr and "Traceback" not in p.stderr


def _option(command: Command, flag: str) -> argparse.Action | None:
    parser = argparse.ArgumentParser()
    command.configure(parser)
    return next((a for a in parser._actions if flag in a.option_strings), None)


def test_token_in_options_live_with_the_composition_root() -> None:
    # The proxy alone is a pass-through: --tokenizer, --upstream-api and --model come from
    # compose, which is what reads them; every command offers the same endpoint names.
    from tracewire.proxy import COMMAND as BARE_PROXY
    from tracewire.tito.codecs import UpstreamApi

    assert _option(BARE_PROXY, "--tokenizer") is None
    assert _option(BARE_PROXY, "--upstream-api") is None
    for name in ("proxy", "serve", "eval"):
        command = COMMANDS[name]()
        assert _option(command, "--tokenizer") is not None, name
        api = _option(command, "--upstream-api")
        assert api is not None and tuple(api.choices or ()) == tuple(UpstreamApi), name


def test_worker_resources_option_is_parsed_once_for_serve_and_eval() -> None:
    # ``tracewire serve`` and ``tracewire eval`` share this parser for --worker-resources.
    assert parse_worker_resources(None) is None
    assert parse_worker_resources('{"env_node": 1, "gpu": 0.5}') == {"env_node": 1.0, "gpu": 0.5}
    for bad in ("[1]", '{"env": "x"}', "not json"):
        with pytest.raises(ValueError, match="--worker-resources is not a JSON object"):
            parse_worker_resources(bad)


def _parse(command: Command, argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(exit_on_error=False)
    command.configure(parser)
    return parser.parse_args(argv)


def test_model_options_of_serve_live_with_the_composition_root() -> None:
    # serve alone knows no model: --base-url, --tokenizer and --upstream-api are compose's,
    # which turns them into env_factory's options; the command line's serve has them.
    from tracewire.serve import COMMAND as BARE_SERVE

    flags = ("--base-url", "--tokenizer", "--upstream-api")
    for flag in flags:
        assert _option(BARE_SERVE, flag) is None, flag
        assert _option(COMMANDS["serve"](), flag) is not None, flag
    with pytest.raises(SystemExit):
        # exit_on_error=False does not cover unrecognised arguments: argparse exits.
        _parse(BARE_SERVE, ["standin", "--tokenizer", "X"])
    given = _parse(COMMANDS["serve"](), ["standin", "--tokenizer", "X", "--base-url", "U",
                                         "--upstream-api", "sglang"])
    assert ENV_MODEL_OPTIONS.read(given) == {"base_url": "U", "tokenizer": "X",
                                             "upstream_api": "sglang"}
    # Not given: no key at all, so env_factory's defaults (built-in model, completions) hold.
    assert ENV_MODEL_OPTIONS.read(_parse(COMMANDS["serve"](), ["standin"])) == {}


def test_serve_help_lists_the_model_options_before_option() -> None:
    # Where they were when serve defined them, with the same help.
    p = subprocess.run([sys.executable, "-m", "tracewire", "serve", "--help"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    text = " ".join(p.stdout.split())
    at = [text.index(flag) for flag in ("--runner RUNNER", "--base-url BASE_URL",
                                        "--tokenizer DIR|FILE.gguf", "--upstream-api",
                                        "--option KEY=VALUE")]
    assert at == sorted(at), text
    assert "model server for real environments (default: built-in model)" in text
    assert "token-in endpoint with --tokenizer" in text
