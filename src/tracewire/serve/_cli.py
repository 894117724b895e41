"""``tracewire serve ENV``: run the env server until SIGINT/SIGTERM, then drain and stop."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import signal
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from .._command import Command, parse_worker_resources
from .._errors import EnvError, ServeError
from .._memory import tune_allocator
from ._broker import EnvServer
from ._config import DEFAULT_ADDRESS, ServerConfig
from ._open import WORKER_BACKENDS, WorkerBackend, make_pool
from ._runner import RunnerFactory

__all__ = ["COMMAND", "HELP", "RunnerOptions", "configure", "run", "serve_command"]

HELP = "Serve an environment's rollouts over ZMQ from a pool of worker processes."


@dataclass(frozen=True)
class RunnerOptions:
    """How the composition root extends the command: options of its own (a model server,
    a tokenizer and the like) added by ``configure``, and ``read(args)``, the runner
    factory options they set (added after, and over, ``--option``'s)."""

    configure: Callable[[argparse.ArgumentParser], None]
    read: Callable[[argparse.Namespace], Mapping[str, Any]]


def configure(parser: argparse.ArgumentParser, runner_options: RunnerOptions | None = None
              ) -> None:
    """Add the ``serve`` options to ``parser``, and ``runner_options``' own before
    ``--option``."""
    d = ServerConfig()
    parser.add_argument("env", help="environment name ('standin': no model, for benchmarks)")
    parser.add_argument("--address", default=DEFAULT_ADDRESS,
                        help=f"ZMQ address to bind (default {DEFAULT_ADDRESS}; port 0 = any)")
    parser.add_argument("--workers", type=int, default=d.workers,
                        help="workers kept alive (default %(default)s)")
    parser.add_argument("--max-workers", type=int, default=None,
                        help="most workers under load (default: --workers)")
    parser.add_argument("--max-inflight", type=int, default=d.max_inflight,
                        help="episodes running at once (default %(default)s)")
    parser.add_argument("--max-queue", type=int, default=None,
                        help="episodes waiting beyond that (default 4x max-inflight)")
    parser.add_argument("--run-timeout", type=float, default=d.run_timeout,
                        help="seconds one episode may run (default %(default)s)")
    parser.add_argument("--queue-timeout", type=float, default=d.queue_timeout,
                        help="seconds an episode may wait for a worker (default %(default)s)")
    parser.add_argument("--drain-timeout", type=float, default=30.0,
                        help="on shutdown, seconds to let in-flight runs finish (default 30)")
    parser.add_argument("--idle", type=float, default=d.idle_s,
                        help="stop a surplus worker idle this long (default %(default)s s)")
    parser.add_argument("--backend", choices=WORKER_BACKENDS, default=WorkerBackend.PROCESS.value,
                        help="where workers run: local processes (default), tasks in the "
                             "server process ('inline'), or Ray actors ('ray', needs the "
                             "tracewire[ray] extra)")
    parser.add_argument("--inline", action="store_true",
                        help="same as --backend inline (no process hop; only for runners "
                             "that yield often, e.g. the stand-in)")
    parser.add_argument("--ray-address", default=None,
                        help="Ray cluster to join: 'auto' (the running cluster), "
                             "'ray://HOST:PORT' or 'local' (a new instance); default: this "
                             "machine's instance, or a new one")
    parser.add_argument("--worker-cpus", type=float, default=1.0,
                        help="CPUs each Ray worker actor asks for (default %(default)s)")
    parser.add_argument("--worker-resources", default=None, metavar="JSON",
                        help='custom Ray resources per worker actor, e.g. \'{"env": 1}\'')
    parser.add_argument("--worker-address", default=None,
                        help="ZMQ address the server binds for its workers (default: a "
                             "private ipc socket; with --backend ray tcp://127.0.0.1:0; "
                             "workers on other nodes need e.g. tcp://0.0.0.0:5556)")
    parser.add_argument("--heartbeat-timeout", type=float, default=None,
                        help="seconds of worker silence before it is killed as hung "
                             f"(default {d.heartbeat_timeout}; 2 with --backend ray, so a "
                             "lost node's episodes fail fast)")
    parser.add_argument("--client-key-file", default=None, metavar="PATH",
                        help="where to write the client key file of a TCP --address (mode "
                             "0600; default: a new private temp directory); clients read "
                             "it from $TRACEWIRE_CLIENT_KEY_FILE")
    parser.add_argument("--client-keys", default=None, metavar="FILE",
                        help="further client CURVE public keys to admit, one Z85 key a line")
    parser.add_argument("--no-curve", action="store_true",
                        help="no CURVE on TCP sockets: anyone who reaches a port may pose as "
                             "a worker or client (only on a network you trust entirely)")
    parser.add_argument("--runner", default=None,
                        help="runner factory 'module:attribute' (default: by env)")
    if runner_options is not None:
        runner_options.configure(parser)
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="option for the runner factory (value parsed as JSON if it can be)")


def _options(args: argparse.Namespace, runner_options: RunnerOptions | None
             ) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in args.option:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--option {item!r} is not KEY=VALUE")
        try:
            out[key] = msgspec.json.decode(value)
        except msgspec.DecodeError:
            out[key] = value
    if runner_options is not None:
        out.update(runner_options.read(args))
    return out


def _client_keys(path: str | None) -> list[str]:
    if path is None:
        return []
    with open(path) as f:
        return [line.strip() for line in f if line.strip() and not line.startswith("#")]


async def _serve(args: argparse.Namespace, default_factory: RunnerFactory | None,
                 runner_options: RunnerOptions | None) -> int:
    backend = WorkerBackend.INLINE if args.inline else WorkerBackend(args.backend)
    hb_timeout = args.heartbeat_timeout or (2.0 if backend == WorkerBackend.RAY else
                                            ServerConfig().heartbeat_timeout)
    cfg = ServerConfig(workers=args.workers, max_workers=args.max_workers,
                       max_inflight=args.max_inflight, max_queue=args.max_queue,
                       run_timeout=args.run_timeout, queue_timeout=args.queue_timeout,
                       idle_s=args.idle, worker_endpoint=args.worker_address,
                       heartbeat_timeout=hb_timeout, curve=not args.no_curve,
                       client_key_file=args.client_key_file,
                       client_keys=_client_keys(args.client_keys))
    pool = make_pool(backend, ray_address=args.ray_address, worker_cpus=args.worker_cpus,
                     worker_resources=parse_worker_resources(args.worker_resources))
    # Before serving and on the main thread, where Ray wants to be initialised.
    pool.prepare()
    # The stand-in is serve's own; any other environment runs with the injected default.
    factory = args.runner or (None if args.env == "standin" else default_factory)
    server = EnvServer(args.env, address=args.address, config=cfg, factory=factory,
                       options=_options(args, runner_options), pool=pool)
    await server.start()
    print(f"serving {args.env} on {server.address}", flush=True)
    if server.client_key_file is not None:
        print(f"client key file: {server.client_key_file} (clients: export "
              f"TRACEWIRE_CLIENT_KEY_FILE={server.client_key_file})", flush=True)
    if server.client_key is not None:
        # For clients with a keypair of their own (admitted with --client-keys).
        print(f"server public key: {server.client_key.server_key}", flush=True)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    print("draining", flush=True)
    await server.stop(drain=True, timeout=args.drain_timeout)
    return 0


def run(args: argparse.Namespace, default_factory: RunnerFactory | None = None,
        runner_options: RunnerOptions | None = None) -> int:
    """Run the server until interrupted; returns the exit status. ``default_factory`` is
    the runner factory used without ``--runner``, ``runner_options`` turns the options it
    added into factory options (the composition root passes both)."""
    tune_allocator()  # this process exists to forward episodes
    try:
        return asyncio.run(_serve(args, default_factory, runner_options))
    except (ValueError, OSError, ServeError, EnvError) as exc:
        print(f"tracewire serve: {exc}", file=sys.stderr)
        return 2


def serve_command(default_factory: RunnerFactory | None = None,
                  runner_options: RunnerOptions | None = None) -> Command:
    """The ``serve`` command, running environments other than the stand-in with
    ``default_factory`` unless ``--runner`` names one, its options extended by
    ``runner_options`` (the composition root passes the model server's)."""
    body = functools.partial(run, default_factory=default_factory,
                             runner_options=runner_options)
    return Command("serve", HELP, functools.partial(configure, runner_options=runner_options),
                   body)


#: ``tracewire serve`` with no default factory (the stand-in, or ``--runner``) and no model
#: options.
COMMAND = serve_command()
