"""EnvClient: asks env servers for rollouts and assembles the streamed episodes.

One DEALER socket per server and one receive loop per socket; answers are matched to
requests by request id (``_requests``: the pending request and how its answers apply). For
servers on this host the client also binds one PULL socket on loopback and names it in each
run, so the workers send episode data straight to it (``_direct``; ``direct=False`` keeps
everything on the broker path). A frame that cannot be read is logged and skipped (the
request it belonged to, if any, fails with a clear error), never ending the loop.
Cancelling an awaiting call, or its timeout, tells the server to cancel the run.

A server bound on TCP is a CURVE server: the client connects with the key from the server's
client key file (``key_file``, else the files named by ``TRACEWIRE_CLIENT_KEY_FILE``, else
the key of a server running in this process). Direct-path messages carry a random token the
client sent with the run (through the authenticated broker); others are dropped and counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import os
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

import zmq

from .._errors import ProtocolError, RunTimeout, ServeError, TracewireError
from .._memory import tune_allocator
from ..trace import SCHEMA_VERSION, new_id
from ._auth import KEY_FILE_ENV, ClientKey, is_tcp, local_key, read_key_file
from ._direct import is_local_endpoint, loopback_id
from ._io import Reader, send_retry
from ._protocol import PROTOCOL_VERSION, Kind, encode_envelope
from ._requests import STREAMED, OnDelta, Request, RunResult, on_message

__all__ = ["DEFAULT_TIMEOUT", "EnvClient"]

log = logging.getLogger("tracewire.serve.client")

#: Client-side deadline of one run or group (longer than the server's default run timeout,
#: so the server's clearer error normally arrives first).
DEFAULT_TIMEOUT = 900.0
#: Seconds between a waiting client's heartbeats; the broker cancels the runs of a client
#: silent for several of them (see ``_liveness``), so a killed client frees its workers.
HEARTBEAT_S = 0.5


class EnvClient:
    """Client of one or several env servers; spreads runs over them by pending load.

    ``tune_memory`` (on by default) raises this process's glibc mmap/trim thresholds (see
    :func:`~tracewire._memory.tune_allocator`) so received token memory is reused
    instead of page-faulted anew for every episode (bench/README.md, serve, has the figure).
    It affects the whole process (blocks under 64 MiB come
    from the heap; up to 256 MiB of freed heap is kept), so pass ``tune_memory=False``
    where that matters more than receive speed.

    ``direct`` (on by default) lets workers of servers on this host send episode data
    straight to this client, past the broker: two fewer socket hops per token byte. It is
    used for a server only after :meth:`connect` found that it shares this process's
    loopback (same kernel boot and network namespace; not through a tunnel).

    ``key_file`` is the client key file a CURVE server wrote (``tracewire serve`` prints
    its path), or a map from address to key file for several servers; without it the files
    in ``$TRACEWIRE_CLIENT_KEY_FILE`` (``os.pathsep``-separated) are matched to addresses by
    the address they name (one file alone serves every TCP address).
    """

    def __init__(self, address: str | Sequence[str], *, timeout: float = DEFAULT_TIMEOUT,
                 protocol: int = PROTOCOL_VERSION, tune_memory: bool = True,
                 direct: bool = True,
                 key_file: str | os.PathLike[str] | Mapping[str, str | os.PathLike[str]]
                 | None = None) -> None:
        self.addresses = [address] if isinstance(address, str) else list(address)
        if not self.addresses:
            raise ValueError("EnvClient needs at least one server address")
        if tune_memory:
            tune_allocator()
        self.timeout = timeout
        self._protocol = protocol  # another value only to test the server's refusal
        self._ctx: zmq.Context[Any] | None = None
        self._socks: dict[str, zmq.Socket[Any]] = {}
        # One reader per socket drains every ready message per wake-up (see _io).
        self._readers: dict[str, Reader] = {}
        self._pending: dict[str, Request] = {}
        self._rr = itertools.count()
        self._direct = direct
        self._data_address: str | None = None
        # Servers whose hello named this process's own loopback (see _direct).
        self._direct_ok: set[str] = set()
        self._hb_task: asyncio.Task[None] | None = None
        self._key_file = key_file
        # Proves a direct-path message comes from a worker the broker gave our run to.
        self._data_token = secrets.token_bytes(16)
        #: Direct-path messages dropped for want of the token (someone else sent them).
        self.dropped = 0

    # -- connection ------------------------------------------------------------------------
    def _ensure(self) -> None:
        if self._ctx is not None:
            return
        keys = self._keys()
        self._ctx = zmq.Context()
        for addr in self.addresses:
            s = self._ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            key = keys.get(addr)
            if key is not None:
                key.apply(s)
            try:
                s.connect(addr)
            except zmq.ZMQError as exc:
                raise ServeError(f"cannot connect to {addr}: {exc}") from exc
            self._socks[addr] = s
            reader = Reader(s, functools.partial(self._receive, addr), addr)
            reader.start()
            self._readers[addr] = reader
        if self._direct and any(is_local_endpoint(a) for a in self.addresses):
            data = self._ctx.socket(zmq.PULL)
            data.setsockopt(zmq.LINGER, 0)
            data.bind("tcp://127.0.0.1:0")
            self._data_address = str(data.getsockopt_string(zmq.LAST_ENDPOINT))
            self._socks[self._data_address] = data
            reader = Reader(data, self._receive_direct, "direct")
            reader.start()
            self._readers[self._data_address] = reader

    def _keys(self) -> dict[str, ClientKey]:
        """The CURVE key for each TCP address that has one (read from small files)."""
        tcp = [a for a in self.addresses if is_tcp(a)]
        out: dict[str, ClientKey] = {}
        if not tcp:
            return out
        given = self._key_file
        if isinstance(given, Mapping):
            return {a: read_key_file(p) for a, p in given.items() if a in tcp}
        if given is not None:
            key = read_key_file(given)
            return dict.fromkeys(tcp, key)
        files = [read_key_file(p) for p in os.environ.get(KEY_FILE_ENV, "").split(os.pathsep)
                 if p]
        for a in tcp:
            named = [k for k in files if k.address == a]
            if named:
                out[a] = named[0]
            elif len(files) == 1:
                out[a] = files[0]
            elif (mine := local_key(a)) is not None:
                out[a] = mine
        return out

    async def connect(self, timeout: float = 10.0) -> EnvClient:
        """Check every server answers and speaks this protocol/schema version."""
        self._ensure()
        for addr in self.addresses:
            try:
                body = await self._call(addr, Kind.HELLO, {}, timeout)
            except ServeError as exc:
                if is_tcp(addr) and "no answer" in str(exc):
                    raise ServeError(
                        f"{exc} (a tracewire server on TCP admits only clients holding its "
                        f"key: pass key_file= or set {KEY_FILE_ENV} to the client key file "
                        f"the server wrote)") from exc
                raise
            if body.get("proto") != PROTOCOL_VERSION or body.get("schema") != SCHEMA_VERSION:
                raise ProtocolError(f"{addr} speaks protocol {body.get('proto')} / schema "
                                    f"{body.get('schema')}; this client speaks "
                                    f"{PROTOCOL_VERSION} / {SCHEMA_VERSION}")
            here = loopback_id()
            if self._data_address is not None and here is not None and \
                    body.get("loopback") == here:
                self._direct_ok.add(addr)
        return self

    async def close(self) -> None:
        """Fail pending requests, stop the receive loops and close the sockets."""
        for req in list(self._pending.values()):
            req.fail(ServeError("client closed"))
        if self._hb_task is not None:
            self._hb_task.cancel()
            self._hb_task = None
        for r in self._readers.values():
            r.stop()
        for s in self._socks.values():
            s.close(linger=0)
        if self._ctx is not None:
            self._ctx.term()
        self._socks.clear()
        self._readers.clear()
        self._ctx = None
        self._data_address = None
        self._direct_ok.clear()

    async def __aenter__(self) -> EnvClient:
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- requests --------------------------------------------------------------------------
    def _pick(self) -> str:
        load = {a: 0 for a in self.addresses}
        for req in self._pending.values():
            load[req.server] = load.get(req.server, 0) + 1
        start = next(self._rr)
        order = self.addresses[start % len(self.addresses):] + \
            self.addresses[: start % len(self.addresses)]
        return min(order, key=lambda a: load[a])

    def _send_now(self, addr: str, kind: str, rid: str, body: dict[str, Any]) -> None:
        with contextlib.suppress(zmq.ZMQError):
            self._readers[addr].send([encode_envelope(kind, rid, body, proto=self._protocol)])

    def _heartbeats(self) -> None:
        if self._hb_task is None or self._hb_task.done():
            self._hb_task = asyncio.create_task(self._heartbeat(), name="envclient-hb")

    async def _heartbeat(self) -> None:
        # Runs while runs are pending; a lost beat (full queue) is fine, the next one comes.
        while True:
            await asyncio.sleep(HEARTBEAT_S)
            servers = {r.server for r in self._pending.values()
                       if r.kind in STREAMED}
            if not servers:
                return
            for addr in servers:
                if addr in self._readers:
                    self._send_now(addr, Kind.HB, "", {})

    async def _call(self, addr: str, kind: str, body: dict[str, Any], timeout: float,
                    req: Request | None = None) -> Any:
        self._ensure()
        loop = asyncio.get_running_loop()
        if req is None:
            req = Request(new_id(), kind, addr, loop.create_future())
        self._pending[req.rid] = req
        if kind in STREAMED:
            self._heartbeats()
        deadline = asyncio.timeout(timeout)
        try:
            async with deadline:
                try:
                    await send_retry(self._readers[addr].send,
                                     [encode_envelope(kind, req.rid, body, proto=self._protocol)])
                except zmq.ZMQError as exc:
                    raise ServeError(f"cannot send to {addr}: {exc}") from exc
                return await req.fut
        except TimeoutError as exc:
            if not deadline.expired():
                raise  # the server's RunTimeout, not ours
            if kind in STREAMED:
                self._send_now(addr, Kind.CANCEL, new_id(), {"target": req.rid})
                raise RunTimeout(f"{kind} {req.rid} on {addr}: no answer within {timeout}s "
                                 "(client-side timeout); asked the server to cancel") from exc
            raise ServeError(f"{kind}: no answer from {addr} within {timeout}s") from exc
        except asyncio.CancelledError:
            # Cancelling this task cancels ``req.fut`` too; only a received answer means
            # there is nothing left to cancel on the server.
            if kind in STREAMED and (not req.fut.done() or req.fut.cancelled()):
                self._send_now(addr, Kind.CANCEL, new_id(), {"target": req.rid})
            raise
        finally:
            self._pending.pop(req.rid, None)

    async def _episodes(self, kind: str, task: dict[str, Any], r: int, on_delta: OnDelta | None,
                        timeout: float | None, keep_frames: bool, request_id: str | None,
                        group_id: str | None) -> list[RunResult]:
        addr = self._pick()
        loop = asyncio.get_running_loop()
        req = Request(request_id or new_id(), kind, addr, loop.create_future(), n=r,
                      on_delta=on_delta)
        if req.rid in self._pending:
            raise ValueError(f"request id {req.rid!r} is already in use")
        body: dict[str, Any] = {"task": task, "stream": on_delta is not None or not keep_frames,
                                "keep_frames": keep_frames, "hb": HEARTBEAT_S}
        if self._data_address is not None and addr in self._direct_ok:
            body["data"] = self._data_address
            body["data_key"] = self._data_token.hex()
        if kind == Kind.RUN_GROUP:
            body["r"] = r
            if group_id is not None:
                body["group_id"] = group_id
        results: dict[int, RunResult] = await self._call(
            addr, kind, body, self.timeout if timeout is None else timeout, req)
        return [results[i] for i in range(r)]

    async def run(self, task: dict[str, Any], *, on_delta: OnDelta | None = None,
                  timeout: float | None = None, keep_frames: bool = False,
                  request_id: str | None = None) -> RunResult:
        """Run one episode of ``task``; deltas stream to ``on_delta`` as turns commit.

        With ``keep_frames`` the result also holds the whole episode's frames as received
        (without ``on_delta`` the server then sends only those, not the deltas).
        """
        out = await self._episodes(Kind.RUN, task, 1, on_delta, timeout, keep_frames, request_id,
                                   None)
        return out[0]

    async def run_group(self, task: dict[str, Any], r: int, *, on_delta: OnDelta | None = None,
                        timeout: float | None = None, keep_frames: bool = False,
                        request_id: str | None = None,
                        group_id: str | None = None) -> list[RunResult]:
        """Run ``r`` episodes of ``task`` sharing one group id (spread over workers)."""
        return await self._episodes(Kind.RUN_GROUP, task, r, on_delta, timeout, keep_frames,
                                    request_id, group_id)

    async def cancel(self, request_id: str, timeout: float = 10.0) -> int:
        """Cancel a run or group by request id; returns how many episodes were cancelled."""
        req = self._pending.get(request_id)
        targets = [req.server] if req is not None else self.addresses
        n = 0
        for addr in targets:
            body = await self._call(addr, Kind.CANCEL, {"target": request_id}, timeout)
            n += int(body.get("cancelled", 0))
        return n

    async def _info(self, kind: str, address: str | None, timeout: float) -> dict[str, Any]:
        if address is not None or len(self.addresses) == 1:
            return dict(await self._call(address or self.addresses[0], kind, {}, timeout))
        servers: dict[str, Any] = {}
        for addr in self.addresses:
            try:
                servers[addr] = await self._call(addr, kind, {}, timeout)
            except TracewireError as exc:
                servers[addr] = {"healthy": False, "error": str(exc)}
        return {"healthy": any(s.get("healthy") for s in servers.values()), "servers": servers}

    async def health(self, address: str | None = None, timeout: float = 10.0) -> dict[str, Any]:
        """Health of one server (or of all, with ``healthy`` true if any is)."""
        return await self._info(Kind.HEALTH, address, timeout)

    async def stats(self, address: str | None = None, timeout: float = 10.0) -> dict[str, Any]:
        """Counters and per-worker rows of one server (or of all)."""
        return await self._info(Kind.STATS, address, timeout)

    # -- receiving -------------------------------------------------------------------------
    def _receive_direct(self, frames: list[Any]) -> None:
        # Anyone on the host can reach the loopback data socket: only our workers know this.
        if len(frames) < 2 or frames[0].bytes != self._data_token:
            self.dropped += 1
            return
        self._receive("direct", frames[1:])

    def _receive(self, addr: str, frames: list[Any]) -> None:
        try:
            self._on_message(addr, frames)
        except Exception as exc:
            log.warning("malformed message from %s skipped: %s", addr, exc)

    def _on_message(self, addr: str, frames: list[Any]) -> None:
        # A method of its own: bench/serve.py wraps it on one client to count messages.
        on_message(self._pending, addr, frames)
