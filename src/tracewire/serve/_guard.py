"""The broker's CURVE side: its keypair, the ZAP gate, each worker's keys, the client key.

The broker decides which of its sockets are CURVE servers (those bound on TCP) and asks the
guard to arm them; the guard makes the keys, tells the gate whom to admit, and writes the
client key file where only this user can read it (see ``_auth`` and docs/CLUSTER.md).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

import zmq

from .._errors import ServeError
from ._auth import (
    CLIENTS,
    WORKERS,
    ClientKey,
    Gate,
    KeyPair,
    register_local,
    unregister_local,
    write_key_file,
)

__all__ = ["Guard"]


class Guard:
    """CURVE for one broker's context; inert until :meth:`arm` is called."""

    def __init__(self, ctx: zmq.Context[Any]) -> None:
        self._ctx = ctx
        # One keypair per server: the identity of both its sockets.
        self._keys = KeyPair.new()
        self._gate: Gate | None = None
        self._keydir: str | None = None
        self._address: str | None = None
        #: True once the worker socket is a CURVE server.
        self.workers = False
        #: The client key file and its content, once the client socket is a CURVE server.
        self.client_key_file: str | None = None
        self.client_key: ClientKey | None = None

    def start(self) -> None:
        """Install the gate; call before any CURVE socket binds (else all keys get in)."""
        if self._gate is None:
            self._gate = Gate(self._ctx)
            self._gate.start()

    def arm(self, sock: zmq.Socket[Any], *, workers: bool) -> None:
        """Make ``sock`` (not yet bound) a CURVE server for workers or for clients."""
        self.start()
        sock.curve_server = True
        sock.curve_secretkey = self._keys.secret.encode()
        sock.zap_domain = WORKERS if workers else CLIENTS
        if workers:
            self.workers = True

    def admit_clients(self, address: str, key_file: str | None, extra: list[str]) -> None:
        """Make, authorise and write this server's client key (``address``: where it is bound)."""
        assert self._gate is not None
        pair = KeyPair.new()
        key = ClientKey(server_key=self._keys.public, public=pair.public, secret=pair.secret,
                        address=address)
        self._gate.allow_client(pair.public)
        for public in extra:
            self._gate.allow_client(public)
        path = key_file
        if path is None:
            self._keydir = tempfile.mkdtemp(prefix="tw-keys-")  # mode 0700
            path = os.path.join(self._keydir, "client.key")
        try:
            self.client_key_file = str(write_key_file(path, key))
        except OSError as exc:
            raise ServeError(f"cannot write the client key file {path}: {exc}") from exc
        self.client_key = key
        self._address = address
        register_local(address, key)

    def worker_keys(self, worker_id: str) -> dict[str, str]:
        """A new keypair that admits exactly ``worker_id`` (empty without CURVE workers)."""
        if not self.workers or self._gate is None:
            return {}
        pair = KeyPair.new()
        self._gate.allow_worker(pair.public, worker_id)
        return {"server_key": self._keys.public, "public_key": pair.public,
                "secret_key": pair.secret}

    def forget_worker(self, public: str) -> None:
        """A worker ended: its key opens nothing any more."""
        if public and self._gate is not None:
            self._gate.forget_worker(public)

    def denied(self) -> dict[str, int]:
        """Handshakes refused for an unknown key, by domain."""
        return dict(self._gate.denied) if self._gate is not None else {}

    def close(self) -> None:
        """Close the gate (before the context terminates) and remove the key directory."""
        if self._gate is not None:
            self._gate.close()
            self._gate = None
        if self._address is not None:
            unregister_local(self._address)
        if self._keydir:
            shutil.rmtree(self._keydir, ignore_errors=True)
