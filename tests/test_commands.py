"""The command line takes each part's public command object; compose wires proxy and serve."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tracewire._command import Command, parse_worker_resources
from tracewire.cli import COMMANDS
from tracewire.compose import env_factory, make_upstream


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
    assert proxy.run.keywords == {"make_upstream": make_upstream}  # type: ignore[attr-defined]
    assert serve.run.keywords == {"default_factory": env_factory}  # type: ignore[attr-defined]
    assert BARE_PROXY.run.keywords == {"make_upstream": None}  # type: ignore[attr-defined]
    assert BARE_SERVE.run.keywords == {"default_factory": None}  # type: ignore[attr-defined]


def test_serve_of_a_real_env_without_a_factory_is_one_line_and_exit_2() -> None:
    # serve's bare command (no composition root): a real environment has no runner.
    code = ("import sys, argparse; from tracewire.serve import COMMAND as C; "
            "p = argparse.ArgumentParser(); C.configure(p); "
            "sys.exit(C.run(p.parse_args(['arithmetic', '--address', 'tcp://127.0.0.1:0'])))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 2, p.stderr
    assert "needs a runner factory" in p.stderr and "Traceback" not in p.stderr


def test_worker_resources_option_is_parsed_once_for_serve_and_eval() -> None:
    # ``tracewire serve`` and ``tracewire eval`` share this parser for --worker-resources.
    assert parse_worker_resources(None) is None
    assert parse_worker_resources('{"env_node": 1, "gpu": 0.5}') == {"env_node": 1.0, "gpu": 0.5}
    for bad in ("[1]", '{"env": "x"}', "not json"):
        with pytest.raises(ValueError, match="--worker-resources is not a JSON object"):
            parse_worker_resources(bad)
