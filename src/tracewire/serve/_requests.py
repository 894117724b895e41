"""The client's side of a request: what it waits for, and how an answer reaches it.

A :class:`Request` is one pending call (a run, a group, or a one-answer call such as
``health``); :func:`on_message` matches a received message to its request by request id and
applies it. An episode's deltas are sequence- and cursor-checked by an
:class:`~tracewire.codec.EpisodeAssembler`; a message that breaks the protocol fails the
request it belonged to (if any) and raises, for the receive loop to log and skip.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .._errors import DeltaError, ProtocolError, ServeError, TracewireError
from ..codec import EpisodeAssembler, EpisodeDelta, decode_frames
from ..trace import Episode
from ._protocol import Envelope, Kind, cursor_list, decode_envelope, error_from_body

__all__ = ["STREAMED", "OnDelta", "Request", "RunResult", "on_message"]

# The client's logger: these messages read as they did when this lived in ``_client``.
log = logging.getLogger("tracewire.serve.client")

#: Called on the receive loop with each applied delta and the episode assembled so far.
OnDelta = Callable[[EpisodeDelta, Episode], object]
#: The request kinds answered with episode frames (and kept alive by heartbeats).
STREAMED = (Kind.RUN, Kind.RUN_GROUP)


@dataclass
class RunResult:
    """One received episode, with what it cost on the wire.

    ``frames`` (only with ``keep_frames=True``) are the frames of the whole episode exactly
    as they arrived, for ``RunWriter.append_frames(frames)``.
    """

    episode: Episode
    request_id: str
    server: str
    deltas: int = 0
    wire_bytes: int = 0
    frames: list[memoryview] | None = None


@dataclass(eq=False)
class Request:
    """One pending call to ``server``: ``fut`` gets the answer's body, or (runs) the ``n``
    episodes by index as their final replies arrive."""

    rid: str
    kind: str
    server: str
    fut: asyncio.Future[Any]
    n: int = 1
    on_delta: OnDelta | None = None
    assemblers: dict[int, EpisodeAssembler] = field(default_factory=dict)
    results: dict[int, RunResult] = field(default_factory=dict)
    wire: dict[int, int] = field(default_factory=dict)

    def fail(self, exc: BaseException) -> None:
        """End the call with ``exc`` unless it has ended already."""
        if not self.fut.done():
            self.fut.set_exception(exc)

    def answer(self, addr: str, env: Envelope, frames: list[Any]) -> None:
        """Apply an answer from ``addr``; raises (after failing the call) on a bad one."""
        if env.kind == Kind.ERROR:
            self.fail(error_from_body(env.body, addr))
        elif env.kind not in (Kind.DELTA, Kind.REPLY):
            raise ProtocolError(f"unknown answer kind {env.kind!r}")
        elif self.kind not in STREAMED:
            if not self.fut.done():
                self.fut.set_result(env.body)
        else:
            try:
                self._episode_frames(env.kind, env.body, frames)
            except TracewireError as exc:
                self.fail(exc if isinstance(exc, ServeError | DeltaError) else
                          ProtocolError(f"bad {env.kind} from {addr}: {exc}"))
                raise

    def _episode_frames(self, kind: str, body: dict[str, Any], frames: list[Any]) -> None:
        i = body.get("i", 0)
        if not isinstance(i, int) or not 0 <= i < self.n or i in self.results:
            raise ProtocolError(f"{kind} for episode index {i!r} of a request for {self.n}")
        bufs = [f.buffer for f in frames[1:]]
        self.wire[i] = self.wire.get(i, 0) + sum(f.buffer.nbytes for f in frames)
        asm = self.assemblers.setdefault(i, EpisodeAssembler())
        if kind == Kind.DELTA:
            d = decode_frames(bufs)
            if not isinstance(d, EpisodeDelta):
                raise ProtocolError(f"delta frames hold a {type(d).__name__}")
            self._apply(asm, d)
            return
        # Final reply: the last delta, or the whole episode (keep_frames).
        keep: list[memoryview] | None = None
        if body.get("frames") == "episode":
            ep = decode_frames(bufs)
            if not isinstance(ep, Episode):
                raise ProtocolError(f"episode frames hold a {type(ep).__name__}")
            keep = bufs
        else:
            d = decode_frames(bufs)
            if not isinstance(d, EpisodeDelta) or not d.final:
                raise ProtocolError("reply frames are not a final delta")
            ep = self._apply(asm, d)
        if asm.seq != body.get("seq"):
            raise DeltaError(f"episode {ep.id}: got {asm.seq} deltas, server sent "
                             f"{body.get('seq')}")
        cursors = body.get("cursors", {})
        have = {t.id: cursor_list(t) for t in ep.traces}
        if have != cursors:
            raise DeltaError(f"episode {ep.id}: assembled cursors {have} disagree with the "
                             f"server's {cursors}")
        self.results[i] = RunResult(ep, self.rid, self.server, asm.seq, self.wire[i], keep)
        if len(self.results) == self.n and not self.fut.done():
            self.fut.set_result(self.results)

    def _apply(self, asm: EpisodeAssembler, d: EpisodeDelta) -> Episode:
        ep = asm.apply(d)
        if self.on_delta is not None:
            try:
                self.on_delta(d, ep)
            except Exception:
                log.exception("on_delta callback failed (ignored)")
        return ep


def on_message(pending: Mapping[str, Request], addr: str, frames: list[Any]) -> None:
    """Hand a message from ``addr`` to the pending request it answers (one no longer
    pending is dropped); raises on a malformed one, failing its request when it names one."""
    try:
        env = decode_envelope(frames[0].buffer)
    except ProtocolError as exc:
        req = pending.get(getattr(exc, "rid", None) or "")
        if req is not None:
            req.fail(exc)
        raise
    req = pending.get(env.rid)
    if req is None:
        if env.kind == Kind.ERROR:
            log.debug("error from %s for no pending request: %s", addr,
                      error_from_body(env.body, addr))
        return
    req.answer(addr, env, frames)
