"""``tracewire eval ENV``: run an environment against a model and store the run."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import signal
import sys
from typing import TYPE_CHECKING

from .._command import Command, parse_worker_resources
from .._errors import PlanError, TracewireError
from ..env import load_environment
from ..store import RunStatus
from ._options import BACKENDS, DEFAULT_UPSTREAM_API, ENGINES, RUNTIMES, UPSTREAM_APIS, Backend

if TYPE_CHECKING:
    from ._plan import EvalPlan

HELP = "Run an environment's tasks × rollouts through the proxy and store the run."

__all__ = ["EVAL_COMMAND", "HELP", "configure", "plan_from_args", "run", "run_cli"]


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``eval`` arguments."""
    parser.add_argument("env", metavar="ENV",
                        help="bundled name (arithmetic, tools, guess, command), entry point, "
                             "module path (pkg.mod[:attr]) or .py file")
    parser.add_argument("--model", help="model name (default: the built-in model's, or the "
                                        "first listed by --base-url); with --engine, the "
                                        "GGUF file (default: the bundled SmolLM2-135M)")
    parser.add_argument("--base-url", help="OpenAI-compatible server (default: start the "
                                           "built-in model in-process)")
    parser.add_argument("--api-key", help="key for --base-url (default: none)")
    parser.add_argument("--engine", choices=ENGINES, default=None,
                        help="start a local engine for the eval and serve it token-in/"
                             "token-out (llamacpp: llama.cpp's server, built on first use)")
    parser.add_argument("--max-model-len", type=int, default=None,
                        help="context length of the built-in model, in tokens (default: its own)")
    parser.add_argument("-n", "--tasks", dest="n", type=int, default=None,
                        help="number of tasks (default: all)")
    parser.add_argument("-r", "--rollouts", dest="r", type=int, default=1,
                        help="rollouts per task, grouped (default: 1)")
    parser.add_argument("-c", "--concurrency", type=int, default=8,
                        help="rollouts in flight (default: 8)")
    parser.add_argument("--backend", choices=BACKENDS, default=Backend.LOCAL.value,
                        help="where the rollouts run: local (this process, the default), "
                             "process (env-server worker processes) or ray (Ray actors)")
    parser.add_argument("--workers", type=int, default=2,
                        help="env-server workers, with --backend process/ray (default: 2)")
    parser.add_argument("--ray-address", default=None,
                        help="Ray cluster to join with --backend ray: auto, ray://host:port "
                             "(default: this machine's instance, or a new one)")
    parser.add_argument("--worker-cpus", type=float, default=1.0,
                        help="CPUs each Ray worker actor asks for (default: 1)")
    parser.add_argument("--worker-resources", default=None, metavar="JSON",
                        help='custom Ray resources per worker, e.g. \'{"env_node": 1}\'')
    parser.add_argument("--runtime", choices=RUNTIMES, default=None,
                        help="where a command harness's agent runs: local (a host "
                             "subprocess, unsafe for untrusted agents), bwrap (a sandbox "
                             "whose only way out is its proxy session) or docker "
                             "(default: the environment's choice, else a host subprocess)")
    parser.add_argument("--sandbox-path", action="append", default=[], metavar="DIR",
                        help="with --runtime bwrap: a host directory bound read-only and put "
                             "first on the sandbox's PATH, e.g. where an agent CLI is "
                             "installed (an npm prefix's bin); its executables' install "
                             "trees and interpreters are bound too (repeatable)")
    parser.add_argument("--ro-path", action="append", default=[], metavar="DIR",
                        help="with --runtime bwrap or docker: a host path bound read-only "
                             "at the same path (repeatable)")
    parser.add_argument("--out", help="run directory (default: runs/<env>-<timestamp>)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run in --out, skipping finished (task, rollout) pairs")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (default: 0)")
    parser.add_argument("--temperature", type=float, default=None, help="sampling temperature")
    parser.add_argument("--max-tokens", type=int, default=None, help="tokens per model turn")
    parser.add_argument("--tokenizer", default=None, metavar="DIR|FILE.gguf",
                        help="token-in/token-out: render prompts with this local tokenizer "
                             "directory or GGUF model file and send ids to --base-url "
                             "(needs tracewire[tito])")
    parser.add_argument("--upstream-api", choices=UPSTREAM_APIS, default=DEFAULT_UPSTREAM_API,
                        help="token-in endpoint with --tokenizer (default: completions)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar")


def _resources(text: str | None) -> dict[str, float] | None:
    try:
        return parse_worker_resources(text)
    except ValueError as exc:
        raise PlanError(str(exc)) from exc


def plan_from_args(args: argparse.Namespace) -> EvalPlan:
    """The :class:`EvalPlan` the ``eval`` arguments describe; a bad value is a
    :class:`~tracewire.PlanError`."""
    from ._plan import (
        EvalPlan,
        ModelOptions,
        OutputOptions,
        PlacementOptions,
        SamplingOptions,
        SandboxOptions,
        ScaleOptions,
    )

    return EvalPlan(
        args.env,
        model=ModelOptions(model=args.model, base_url=args.base_url, api_key=args.api_key,
                           max_model_len=args.max_model_len, tokenizer=args.tokenizer,
                           upstream_api=args.upstream_api, engine=args.engine),
        sampling=SamplingOptions(seed=args.seed, temperature=args.temperature,
                                 max_tokens=args.max_tokens),
        scale=ScaleOptions(n=args.n, r=args.r, concurrency=args.concurrency),
        sandbox=SandboxOptions(runtime=args.runtime, ro_paths=tuple(args.ro_path),
                               sandbox_paths=tuple(args.sandbox_path)),
        placement=PlacementOptions(backend=args.backend, workers=args.workers,
                                   ray_address=args.ray_address, worker_cpus=args.worker_cpus,
                                   worker_resources=_resources(args.worker_resources)),
        output=OutputOptions(out=args.out, resume=args.resume),
    )


def _join_ray(args: argparse.Namespace) -> None:
    # Ray wants to be joined from the main thread and blocks for seconds doing it: done
    # here, before the event loop runs; the eval's pool then finds Ray initialised.
    from ..serve import WorkerBackend, make_pool

    make_pool(WorkerBackend.RAY, ray_address=args.ray_address).prepare()


def _fail(reason: str) -> int:
    print(f"tracewire eval: {reason}", file=sys.stderr)
    return 1


async def run_cli(args: argparse.Namespace) -> tuple[int, str | None]:
    """Run the eval with a progress bar and a summary; Ctrl-C stops it cleanly. Returns the
    exit status and the run directory (None when the eval did not start)."""
    # Imported here, not above: ``tracewire --help`` imports this module.
    from rich.console import Console

    from ._evaluate import evaluate_plan
    from ._report import EvalProgress, render_summary

    console = Console(stderr=False)
    try:
        plan = plan_from_args(args)
        # Loaded here, once, for its name on the progress bar; the plan then carries it.
        env = load_environment(plan.env)
    except TracewireError as exc:
        return _fail(str(exc)), None
    plan = dataclasses.replace(plan, env=env)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    bar: EvalProgress | None = None
    progress = None if args.quiet else Console(stderr=True)

    def set_total(total: int | None) -> None:
        nonlocal bar
        if progress is not None:
            bar = EvalProgress(progress, total, env.name)
            bar.__enter__()

    try:
        result = await evaluate_plan(plan, stop=stop,
                                     total_hint=set_total, on_episode=lambda _e, tally:
                                     bar.update(tally) if bar is not None else None)
    except (TracewireError, ValueError, OSError) as exc:
        return _fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__), None
    finally:
        if bar is not None:
            bar.__exit__(None, None, None)
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    summary = result.summary
    render_summary(console, summary)
    if result.status == RunStatus.INTERRUPTED:
        console.print(f"interrupted: {summary.episodes} finished episodes kept; "
                      f"continue with --out {summary.run_dir} --resume")
        return 130, summary.run_dir
    if result.reason is not None:
        return _fail(result.reason), summary.run_dir
    return 0, summary.run_dir


def run(args: argparse.Namespace) -> int:
    """Entry point of ``tracewire eval``."""
    if getattr(args, "engine", None) and (args.base_url or args.tokenizer):
        print("tracewire eval: --engine serves its own model: drop --base-url/--tokenizer",
              file=sys.stderr)
        return 2
    if getattr(args, "backend", Backend.LOCAL) == Backend.RAY:
        try:
            _join_ray(args)
        except TracewireError as exc:
            return _fail(str(exc))
    code, _ = asyncio.run(run_cli(args))
    return code


#: ``tracewire eval``.
EVAL_COMMAND = Command("eval", HELP, configure, run)
