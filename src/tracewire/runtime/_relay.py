"""The host end of a sandbox's only way out: a Unix socket that forwards HTTP/1.1 requests
to the proxy's TCP address, one rollout's session only.

Each request's head is parsed strictly (CRLF only, one framing header, no upgrades) so
that what the relay checks is exactly what the proxy will read; the target must be
``/sessions/<own id>/v1/...`` or plain ``/v1/...`` (which the proxy resolves by the
secret), and when the relay knows the secret the request must carry it. Anything else
(the session API, other sessions, the viewer) gets ``403`` and the connection is closed.
``HEAD /sessions/<id>`` (a reachability probe some CLIs send to their base URL) is
forwarded as ``HEAD /sessions/<id>/v1/models``. Responses are piped back untouched.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import re
import socket
from collections import deque
from pathlib import Path

from ._api import ProxyEndpoint

__all__ = ["SessionRelay"]

_MAX_HEAD = 64 * 1024
_TOKEN = re.compile(rb"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_PATH = r"/v1(?:/[A-Za-z0-9_\-.~]+)*/?"
_QUERY = r"(?:\?[A-Za-z0-9_\-.~=&%]*)?"


class _Refused(Exception):
    def __init__(self, status: int, why: str) -> None:
        super().__init__(why)
        self.status = status
        self.why = why


class SessionRelay:
    """Serve ``socket_path`` (a Unix socket), forwarding allowed requests to the proxy at
    ``endpoint.host:endpoint.port``. ``refused`` keeps the latest refusals (for tests and
    records); ``forwarded`` counts requests let through; at most ``max_connections`` are
    open at once (more get ``503``)."""

    def __init__(self, endpoint: ProxyEndpoint, socket_path: str | Path, *,
                 max_connections: int = 64) -> None:
        self.endpoint = endpoint
        self.socket_path = str(socket_path)
        sid = re.escape(endpoint.id)
        self._allowed = re.compile(rf"^(?:/sessions/{sid})?{_PATH}{_QUERY}$".encode())
        self._probe = re.compile(rf"^/sessions/{sid}/?$".encode())
        self._secret = endpoint.secret.encode()
        self.refused: deque[str] = deque(maxlen=100)
        self.forwarded = 0
        self.max_connections = max_connections
        self._server: asyncio.AbstractServer | None = None
        self._conns: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Create and listen on the socket."""
        self._server = await asyncio.start_unix_server(
            self._serve, self.socket_path, limit=_MAX_HEAD)

    async def stop(self) -> None:
        """Stop listening and drop every open connection."""
        if self._server is not None:
            self._server.close()
            self._server = None
        for t in list(self._conns):
            t.cancel()
        for t in list(self._conns):
            with contextlib.suppress(BaseException):
                await t
        await asyncio.to_thread(Path(self.socket_path).unlink, True)

    # -- one connection ----------------------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        up_w: asyncio.StreamWriter | None = None
        pump: asyncio.Task[None] | None = None
        refusal: _Refused | None = None
        try:
            if len(self._conns) > self.max_connections:
                # Each connection holds one to the proxy: the agent may not exhaust them.
                raise _Refused(503, f"over {self.max_connections} connections")
            up_r, up_w = await asyncio.open_connection(self.endpoint.host, self.endpoint.port)
            sock = up_w.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            pump = asyncio.create_task(_pipe(up_r, writer))
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    break
                except asyncio.LimitOverrunError as exc:
                    raise _Refused(431, "request head too large") from exc
                framing = self._check(head)
                up_w.write(self._rewrite(head))
                await _forward_body(reader, up_w, framing)
                await up_w.drain()
                self.forwarded += 1
        except _Refused as r:
            self.refused.append(r.why)
            refusal = r
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            if pump is not None:
                # Requests are not pipelined by HTTP clients; one that pipelines past a
                # refused request loses the answers still in flight with the connection.
                pump.cancel()
                with contextlib.suppress(BaseException):
                    await pump
            if refusal is not None:
                with contextlib.suppress(OSError):
                    body = refusal.why.encode()
                    writer.write(b"HTTP/1.1 %d Refused\r\nContent-Type: text/plain\r\n"
                                 b"Content-Length: %d\r\nConnection: close\r\n\r\n%s"
                                 % (refusal.status, len(body), body))
                    await writer.drain()
            if up_w is not None:
                up_w.close()
            writer.close()
            self._conns.discard(task)

    def _check(self, head: bytes) -> tuple[str, int]:
        """Validate one request head; return its body framing (``length``/``chunked``)."""
        if head.count(b"\n") != head.count(b"\r\n") or head.count(b"\r") != head.count(
                b"\r\n") or b"\0" in head:
            raise _Refused(400, "bare CR or LF, or NUL, in request head")
        lines = head[:-4].split(b"\r\n")
        parts = lines[0].split(b" ")
        if len(parts) != 3 or parts[2] not in (b"HTTP/1.1", b"HTTP/1.0"):
            raise _Refused(400, "malformed request line")
        method, target = parts[0], parts[1]
        if method not in (b"GET", b"POST", b"HEAD"):
            raise _Refused(405, f"method {method.decode('latin-1')} not allowed")
        length: int | None = None
        chunked = False
        creds: list[bytes] = []
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep or not _TOKEN.match(name):
                raise _Refused(400, "malformed header line")
            key, value = name.lower(), value.strip()
            if key == b"content-length":
                if length is not None or not value.isdigit():
                    raise _Refused(400, "bad or repeated Content-Length")
                length = int(value)
            elif key == b"transfer-encoding":
                if chunked or value.lower() != b"chunked":
                    raise _Refused(400, "unsupported Transfer-Encoding")
                chunked = True
            elif key == b"upgrade":
                raise _Refused(400, "protocol upgrades are not relayed")
            elif key == b"authorization":
                creds.append(value[7:].strip() if value[:7].lower() == b"bearer " else value)
            elif key == b"x-api-key":
                creds.append(value)
        if chunked and length is not None:
            raise _Refused(400, "both Content-Length and Transfer-Encoding")
        t = target.decode("latin-1")
        probe = method == b"HEAD" and self._probe.match(target)
        if not probe and (not self._allowed.match(target) or "/../" in t + "/"
                          or "/./" in t + "/"):
            raise _Refused(403, f"path not allowed from the sandbox: {t[:200]}")
        if self._secret and not probe and not any(
                hmac.compare_digest(c, self._secret) for c in creds):
            raise _Refused(401, "missing or wrong session secret")
        return ("chunked", 0) if chunked else ("length", length or 0)

    def _rewrite(self, head: bytes) -> bytes:
        line, _, rest = head.partition(b"\r\n")
        method, target, version = line.split(b" ")
        if method == b"HEAD" and self._probe.match(target):
            target = target.rstrip(b"/") + b"/v1/models"
            return b" ".join((method, target, version)) + b"\r\n" + rest
        return head


async def _forward_body(reader: asyncio.StreamReader, up: asyncio.StreamWriter,
                        framing: tuple[str, int]) -> None:
    kind, n = framing
    if kind == "length":
        while n > 0:
            chunk = await reader.read(min(n, 1 << 16))
            if not chunk:
                raise asyncio.IncompleteReadError(b"", n)
            up.write(chunk)
            n -= len(chunk)
            if up.transport.get_write_buffer_size() > 1 << 20:
                await up.drain()
        return
    while True:
        line = await reader.readuntil(b"\r\n")
        size_txt = line[:-2].split(b";", 1)[0].strip()
        if not size_txt or len(size_txt) > 16 or any(c not in b"0123456789abcdefABCDEF"
                                                      for c in size_txt):
            raise _Refused(400, "malformed chunk size")
        size = int(size_txt, 16)
        up.write(line)
        if size == 0:
            while (trailer := await reader.readuntil(b"\r\n")) != b"\r\n":
                up.write(trailer)
            up.write(b"\r\n")
            return
        await _forward_body(reader, up, ("length", size))
        if await reader.readexactly(2) != b"\r\n":
            raise _Refused(400, "chunk not followed by CRLF")
        up.write(b"\r\n")


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    try:
        while data := await src.read(1 << 16):
            dst.write(data)
            await dst.drain()
    except OSError:
        pass
    else:
        # The proxy hung up: so does the relay, and the client reconnects.
        with contextlib.suppress(OSError):
            dst.close()
