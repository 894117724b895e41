"""Inside-the-sandbox launcher (stdlib only, run as ``python3 -I -S _launch.py``).

Listens on ``127.0.0.1:PORT`` in the sandbox's own network namespace and pipes each
connection to the Unix socket bind-mounted from the host, whose other end is the filtering
relay; then runs the agent's argv and exits with its status (``128 + signal`` when a signal
killed it). The sandbox's PID 1 dies with this process, taking every leftover child along.

Usage: ``_launch.py PORT SOCKET -- ARGV...`` (``PORT`` 0: no relay, just run ARGV; no
ARGV: only relay, until killed, as a container's main process).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading


def _pipe(src: socket.socket, dst: socket.socket, done: threading.Semaphore) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        if not done.acquire(blocking=False):
            # The other direction is finished too: nothing uses these sockets any more.
            src.close()
            dst.close()


def _serve(conn: socket.socket, path: str) -> None:
    up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        up.connect(path)
    except OSError:
        conn.close()
        up.close()
        return
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    done = threading.Semaphore(1)
    threading.Thread(target=_pipe, args=(conn, up, done), daemon=True).start()
    threading.Thread(target=_pipe, args=(up, conn, done), daemon=True).start()


def _accept(lsock: socket.socket, path: str) -> None:
    while True:
        try:
            conn, _ = lsock.accept()
        except OSError:
            return
        _serve(conn, path)


def main(argv: list[str]) -> int:
    """Start the relay (when asked), run the agent, return its exit status."""
    if len(argv) < 3 or argv[2] != "--":
        print("usage: _launch.py PORT SOCKET -- ARGV...", file=sys.stderr)
        return 2
    port, path, cmd = int(argv[0]), argv[1], argv[3:]
    if port:
        lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        lsock.bind(("127.0.0.1", port))
        lsock.listen(64)
        threading.Thread(target=_accept, args=(lsock, path), daemon=True).start()
    if not cmd:
        threading.Event().wait()
    try:
        child = subprocess.Popen(cmd)
    except OSError as exc:
        print(f"tracewire sandbox: cannot start {cmd[0]!r}: {exc}", file=sys.stderr)
        return 127

    def forward(sig: int, _frame: object) -> None:
        child.send_signal(sig)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    code = child.wait()
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.stdout.flush()
    os._exit(main(sys.argv[1:]))
