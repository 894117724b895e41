"""Who may talk to the broker: CURVE keys, client key files and the ZAP gate.

On a TCP endpoint anyone who can reach the port could pose as a worker or a client, so the
broker's sockets there are CURVE servers (encrypted, and every peer proves it holds a secret
key). The :class:`Gate` answers libzmq's ZAP requests on the broker's event loop: a worker
gets in only with the public key of the keypair the broker made for it, and its ZAP user id
is its worker id, which the broker then compares with the routing id of every message (so a
worker cannot speak for another). A client gets in with a key the server authorised: the one
it wrote to its client key file, or one named in ``ServerConfig.client_keys``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import zmq
from zmq.utils import z85

from .._errors import ServeError
from ._io import Reader

__all__ = [
    "KEY_FILE_ENV",
    "ClientKey",
    "Gate",
    "KeyPair",
    "is_tcp",
    "local_key",
    "read_key_file",
    "register_local",
    "unregister_local",
    "write_key_file",
]

log = logging.getLogger("tracewire.serve")

#: Environment variable naming a client key file (several: joined with ``os.pathsep``).
KEY_FILE_ENV = "TRACEWIRE_CLIENT_KEY_FILE"
#: ZAP domains of the broker's two sockets.
WORKERS, CLIENTS = b"workers", b"clients"
_ZAP_ENDPOINT = "inproc://zeromq.zap.01"
_MAX_KEY_FILE = 4096


def is_tcp(endpoint: str) -> bool:
    """True for a ``tcp://`` endpoint (anyone who can reach the port can connect)."""
    return endpoint.startswith("tcp://")


@dataclass(frozen=True)
class KeyPair:
    """A CURVE keypair as Z85 text (40 characters each)."""

    public: str
    secret: str

    @classmethod
    def new(cls) -> KeyPair:
        """A fresh random keypair."""
        pub, sec = zmq.curve_keypair()
        return cls(pub.decode(), sec.decode())


class ClientKey(msgspec.Struct, frozen=True):
    """What a client needs to reach one CURVE server: its public key and the client's pair."""

    server_key: str
    public: str
    secret: str
    #: The address the server was bound on, to pick the right file among several.
    address: str = ""

    def apply(self, sock: zmq.Socket[Any]) -> None:
        """Make ``sock`` a CURVE client of this server (before it connects)."""
        sock.curve_secretkey = self.secret.encode()
        sock.curve_publickey = self.public.encode()
        sock.curve_serverkey = self.server_key.encode()


def write_key_file(path: str | os.PathLike[str], key: ClientKey) -> Path:
    """Write ``key`` to ``path``, readable by this user only (the file is replaced)."""
    p = Path(path)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, msgspec.json.encode(key))
    finally:
        os.close(fd)
    os.replace(tmp, p)
    return p


def read_key_file(path: str | os.PathLike[str]) -> ClientKey:
    """Read a client key file; ``ServeError`` if it is missing, malformed or readable by others."""
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise ServeError(f"cannot open the client key file {p}: {exc}") from exc
    try:
        st = os.fstat(fd)
        if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            # As ssh does: a key others can read is no secret any more.
            raise ServeError(f"client key file {p} is accessible by other users "
                             f"(mode {stat.S_IMODE(st.st_mode):o}); chmod 600 it")
        data = os.read(fd, _MAX_KEY_FILE + 1)
    finally:
        os.close(fd)
    if len(data) > _MAX_KEY_FILE:
        raise ServeError(f"client key file {p} is larger than {_MAX_KEY_FILE} bytes")
    try:
        key = msgspec.json.decode(data, type=ClientKey)
        for k in (key.server_key, key.public, key.secret):
            if len(z85.decode(k)) != 32:
                raise ValueError("a key is not 32 bytes")
    except (msgspec.DecodeError, ValueError) as exc:
        raise ServeError(f"client key file {p} is not a tracewire client key: {exc}") from exc
    return key


# Servers of this process and their client keys: a client in the server's own process
# (serve_env, tests, an in-process trainer) needs no key file.
_LOCAL: dict[str, ClientKey] = {}


def register_local(address: str, key: ClientKey) -> None:
    """Let clients in this process find ``key`` for ``address``."""
    _LOCAL[address] = key


def unregister_local(address: str) -> None:
    """Forget the key of a server of this process that stopped."""
    _LOCAL.pop(address, None)


def local_key(address: str) -> ClientKey | None:
    """The key of a server running in this process at ``address``, if any."""
    return _LOCAL.get(address)


class Gate:
    """The ZAP handler of one ZMQ context: admits known worker and client public keys.

    One per context (libzmq asks whoever bound the ZAP endpoint); it must be started before
    a CURVE socket of that context accepts connections, or libzmq would let every key in.
    """

    def __init__(self, ctx: zmq.Context[Any]) -> None:
        self._sock = ctx.socket(zmq.REP)
        self._sock.setsockopt(zmq.LINGER, 0)
        try:
            self._sock.bind(_ZAP_ENDPOINT)
        except zmq.ZMQError as exc:
            self._sock.close(0)
            raise ServeError(f"cannot install the CURVE gate: {exc}") from exc
        self._io = Reader(self._sock, self._on_request, "zap")
        self._workers: dict[bytes, str] = {}
        self._clients: set[bytes] = set()
        #: Handshakes refused, by domain (a peer with a key we do not know).
        self.denied = {"workers": 0, "clients": 0}

    def start(self) -> None:
        """Begin answering (on the running loop)."""
        self._io.start()

    def close(self) -> None:
        """Stop answering and close the socket (before the context terminates)."""
        self._io.stop()
        self._sock.close(0)

    def allow_worker(self, public: str, worker_id: str) -> None:
        """Admit the worker holding the secret of ``public``; its user id is ``worker_id``."""
        self._workers[z85.decode(public)] = worker_id

    def forget_worker(self, public: str) -> None:
        """A worker ended: its key opens nothing any more (its slot cannot be taken over)."""
        self._workers.pop(z85.decode(public), None)

    def allow_client(self, public: str) -> None:
        """Admit the client holding the secret of ``public``."""
        self._clients.add(z85.decode(public))

    def _on_request(self, frames: list[Any]) -> None:
        parts = [f.bytes for f in frames]
        if len(parts) < 6:
            log.warning("malformed ZAP request (%d frames)", len(parts))
            # A REP socket must answer before it can read the next request.
            rid = parts[1] if len(parts) > 1 else b""
            self._io.send([b"1.0", rid, b"500", b"malformed request", b"", b""])
            return
        version, request_id, domain, _address, _identity, mechanism = parts[:6]
        user = None
        if mechanism == b"CURVE" and len(parts) == 7:
            key = parts[6]
            if domain == WORKERS:
                user = self._workers.get(key)
            elif domain == CLIENTS and key in self._clients:
                user = "client"
        if user is None:
            name = domain.decode("ascii", "replace")
            if name in self.denied:
                self.denied[name] += 1
            self._io.send([version, request_id, b"400", b"unknown key", b"", b""])
        else:
            self._io.send([version, request_id, b"200", b"OK", user.encode(), b""])
