"""Inside-the-sandbox launcher (stdlib only, run as ``python3 -I -S _launch.py``).

Listens on ``127.0.0.1:PORT`` in the sandbox's own network namespace and pipes each
connection to the Unix socket bind-mounted from the host, whose other end is the filtering
relay; then runs the agent's argv and exits with its status (``128 + signal`` when a signal
killed it). The sandbox's PID 1 dies with this process, taking every leftover child along.

Usage: ``_launch.py PORT SOCKET -- ARGV...`` (``PORT`` 0: no relay, just run ARGV; no
ARGV: only relay, until killed, as a container's main process).

It uses the C modules (``_socket``, ``_thread``, ``_signal``) rather than ``socket``,
``threading`` and ``signal``: those import ``enum`` and friends, ~30 ms of every command's
start on a loaded machine, and this runs once per command.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # no stub; `signal` itself is slow
import _socket
import _thread
import os
import sys


def _pipe(src: _socket.socket, dst: _socket.socket, done: _thread.LockType) -> None:
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(_socket.SHUT_WR)
        except OSError:
            pass
        if not done.acquire(False):
            # The other direction is finished too: nothing uses these sockets any more.
            src.close()
            dst.close()


def _serve(fd: int, path: str) -> None:
    conn = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM, 0, fd)
    up = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        up.connect(path)
    except OSError:
        conn.close()
        up.close()
        return
    conn.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
    done = _thread.allocate_lock()
    _thread.start_new_thread(_pipe, (conn, up, done))
    _thread.start_new_thread(_pipe, (up, conn, done))


def _accept(lsock: _socket.socket, path: str) -> None:
    while True:
        try:
            fd, _ = lsock._accept()  # type: ignore[attr-defined]  # C-level accept: an fd
        except OSError:
            return
        _serve(fd, path)


def main(argv: list[str]) -> int:
    """Start the relay (when asked), run the agent, return its exit status."""
    if len(argv) < 3 or argv[2] != "--":
        sys.stderr.write("usage: _launch.py PORT SOCKET -- ARGV...\n")
        return 2
    port, path, cmd = int(argv[0]), argv[1], argv[3:]
    if port:
        lsock = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
        lsock.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
        lsock.bind(("127.0.0.1", port))
        lsock.listen(64)
        _thread.start_new_thread(_accept, (lsock, path))
    if not cmd:
        forever = _thread.allocate_lock()
        forever.acquire()
        forever.acquire()  # already held by us: blocks until the container is killed
    try:
        # posix_spawn, not subprocess: importing subprocess costs ~10 ms of every start.
        pid = os.posix_spawnp(cmd[0], cmd, os.environ)
    except OSError as exc:
        sys.stderr.write(f"tracewire sandbox: cannot start {cmd[0]!r}: {exc}\n")
        return 127

    def forward(sig: int, _frame: object) -> None:
        try:
            os.kill(pid, sig)
        except OSError:
            pass

    for sig in (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP):
        _signal.signal(sig, forward)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stderr.flush()
    os._exit(code)
