"""Worker process: runs rollouts concurrently on its own event loop and streams them.

Started by a :class:`~tracewire.serve.WorkerPool` as ``python -m tracewire.serve._worker``
with its JSON config (which holds its CURVE secret key) on standard input. It connects a
DEALER socket (routing id = its worker id) to the broker's worker endpoint, builds its
runner from the factory, says ``ready``, heartbeats, and for each ``run`` streams the
episode as delta frames behind a job frame. A cancelled job answers ``CANCELLED`` so the
broker frees its slot. If the factory fails the worker reports ``fatal`` with the reason
and exits 3.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import os
import sys
from typing import Any

import msgspec
import zmq

from .._memory import tune_allocator
from ..codec import EpisodeDelta, encode_frames
from ..trace import Episode
from ._config import WorkerConfig
from ._direct import DirectSenders, valid_data_address
from ._io import Reader, send_retry
from ._protocol import (
    JobKind,
    Kind,
    cursor_list,
    decode_envelope,
    encode_envelope,
    error_body,
    job_frame,
)
from ._runner import Runner, load_factory
from ._stream import EpisodeStreamer

__all__ = ["main", "read_config", "serve_worker"]

log = logging.getLogger("tracewire.serve.worker")


def _token(text: object) -> bytes | None:
    """The client's direct-path token (32 hex digits), or None."""
    if not isinstance(text, str) or len(text) != 32:
        return None
    try:
        return bytes.fromhex(text)
    except ValueError:
        return None


class _Worker:
    def __init__(self, cfg: WorkerConfig, sock: zmq.Socket[Any], runner: Runner) -> None:
        self.cfg = cfg
        self.sock = sock
        self.runner = runner
        self.jobs: dict[int, asyncio.Task[None]] = {}
        self.stopping = False
        self.stopped = asyncio.Event()
        # Every ready message handled per wake-up, no future per message (see _io).
        self.io = Reader(sock, self.on_message, "broker")
        self.direct = DirectSenders(sock.context)

    async def send(self, frames: list[Any]) -> None:
        await send_retry(self.io.send, frames)

    async def heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.heartbeat_s)
            await self.send([b"", encode_envelope(Kind.HB, "", {"load": len(self.jobs)})])

    async def run_job(self, job: int, rid: str, body: dict[str, Any]) -> None:
        try:
            await self._run_job(job, rid, body)
        except asyncio.CancelledError:
            # Always answer, whatever phase the cancel hit, so the broker frees the slot.
            await self.send([job_frame(job, JobKind.CANCELLED), encode_envelope(Kind.ERROR, rid)])
        except Exception as exc:
            log.exception("job %d failed", job)
            await self.send([job_frame(job, JobKind.ERROR), encode_envelope(
                Kind.ERROR, rid, error_body(exc, i=int(body.get("index", 0))))])

    async def _run_job(self, job: int, rid: str, body: dict[str, Any]) -> None:
        task = body.get("task") or {}
        index = int(body.get("index", 0))
        episode = Episode(env=self.cfg.env, task_key=str(task.get("key", "")), task=task,
                          group_id=body.get("group_id"), group_index=index)

        data = body.get("data")
        token = _token(body.get("data_key"))
        data = data if valid_data_address(data) and token is not None else None
        envelope = encode_envelope(Kind.DELTA, rid, {"i": index})

        def send_delta(d: EpisodeDelta, frames: list[Any]) -> None:
            # zmq.Again: the streamer retries later.
            if data is not None:
                self.direct.send(data, [token, envelope, *frames])
            else:
                self.io.send([job_frame(job, JobKind.DELTA), envelope, *frames])

        streamer = EpisodeStreamer(episode, send_delta, stream=bool(body.get("stream", True)),
                                   coalesce_s=self.cfg.coalesce_s)
        streamer.start()
        try:
            await self.runner(task, episode)
        except Exception as exc:
            # A runner should record rollout failures itself; one that raises still yields
            # an episode (marked not ok) rather than a lost run.
            log.exception("job %d: runner raised", job)
            episode.add_error(type(exc).__name__, str(exc), phase="runner")
        finally:
            await streamer.finish()
        await self.reply(job, rid, index, streamer, bool(body.get("keep_frames", False)), data,
                         token)

    async def reply(self, job: int, rid: str, index: int, streamer: EpisodeStreamer,
                    keep_frames: bool, data: str | None, token: bytes | None) -> None:
        episode = streamer.episode
        body: dict[str, Any] = {
            "i": index,
            "cursors": {t.id: cursor_list(t) for t in episode.traces},
        }
        frames: list[Any]
        if keep_frames:
            # The whole episode, ready to be persisted by the client as it arrives.
            frames = encode_frames(episode)
            body["frames"] = "episode"
            if streamer.sender.seq:
                await streamer.flush()
        else:
            d = streamer.sender.delta(final=True)
            assert d is not None  # final=True always yields a delta
            frames = encode_frames(d)
            body["frames"] = "delta"
        body["seq"] = streamer.sender.seq + (0 if keep_frames else 1)
        message = [encode_envelope(Kind.REPLY, rid, body), *frames]
        if data is None:
            await self.send([job_frame(job, JobKind.REPLY), *message])
            return
        # A client slow to read makes this wait; the broker's run timeout bounds it.
        await send_retry(functools.partial(self.direct.send, data), [token, *message])
        await self.send([job_frame(job, JobKind.DONE), encode_envelope(Kind.DONE, rid)])

    def start_job(self, job: int, rid: str, body: dict[str, Any]) -> None:
        t = asyncio.create_task(self.run_job(job, rid, body), name=f"job-{job}")
        self.jobs[job] = t
        t.add_done_callback(lambda _t: self.jobs.pop(job, None))

    def on_message(self, frames: list[Any]) -> None:
        try:
            env = decode_envelope(frames[0].buffer)
        except Exception:
            log.exception("worker %s: bad message from the broker", self.cfg.worker_id)
            return
        if self.stopping:
            return
        if env.kind == Kind.RUN:
            self.start_job(int(env.body["job"]), env.rid, env.body)
        elif env.kind == Kind.CANCEL:
            t = self.jobs.get(int(env.body["job"]))
            if t is not None:
                t.cancel()
        elif env.kind == Kind.STOP:
            # The broker has already answered for any job still here: stop them.
            self.stopping = True
            for t in list(self.jobs.values()):
                t.cancel()
            stopper = asyncio.create_task(self._stop_jobs())
            stopper.add_done_callback(lambda _t: self.stopped.set())

    async def _stop_jobs(self) -> None:
        if self.jobs:
            await asyncio.gather(*self.jobs.values(), return_exceptions=True)

    async def serve(self) -> None:
        """Handle the broker's messages until it says ``stop``."""
        self.io.start()
        try:
            await self.stopped.wait()
        finally:
            self.io.stop()
            self.direct.close()


async def serve_worker(cfg: WorkerConfig, context: zmq.Context[Any] | None = None) -> int:
    """Run one worker on the running loop until the broker stops it; returns its exit status.

    With ``context`` (the broker's, for an ``inproc://`` endpoint) the worker shares it and
    leaves it open; otherwise it has its own.
    """
    ctx: zmq.Context[Any] = context if context is not None else zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 2000)
    sock.setsockopt(zmq.ROUTING_ID, cfg.worker_id.encode())
    if cfg.secret_key:
        sock.curve_secretkey = cfg.secret_key.encode()
        sock.curve_publickey = cfg.public_key.encode()
        sock.curve_serverkey = cfg.server_key.encode()
    sock.connect(cfg.endpoint)
    try:
        try:
            factory = load_factory(cfg.factory)
            cm = factory(cfg.env, cfg.options)
            runner = await cm.__aenter__()
        except Exception as exc:
            log.exception("worker %s: cannot start", cfg.worker_id)
            sock.send_multipart([b"", encode_envelope(Kind.FATAL, "", error_body(exc))])
            return 3
        try:
            w = _Worker(cfg, sock, runner)
            # Start-up objects (modules, model) are permanent: keep them out of GC passes.
            gc.freeze()
            await w.send([b"", encode_envelope(Kind.READY, "", {"pid": os.getpid()})])
            hb = asyncio.create_task(w.heartbeat())
            try:
                await w.serve()
            finally:
                hb.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await hb
        finally:
            await cm.__aexit__(None, None, None)
        return 0
    finally:
        sock.close()
        if context is None:
            ctx.term()


def read_config(fd: int = 0) -> WorkerConfig:
    """Read the JSON :class:`WorkerConfig` from ``fd`` to its end, then point ``fd`` at
    /dev/null, so programs the runner starts do not inherit the channel."""
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, fd)
    os.close(null)
    return msgspec.json.decode(b"".join(chunks), type=WorkerConfig)


def main() -> int:
    """Entry point of a worker process: its configuration comes on standard input."""
    logging.basicConfig(level=os.environ.get("TRACEWIRE_LOG", "WARNING"),
                        format="%(asctime)s worker %(process)d %(levelname)s %(message)s")
    cfg = read_config()
    tune_allocator()
    return asyncio.run(serve_worker(cfg))


if __name__ == "__main__":
    sys.exit(main())
