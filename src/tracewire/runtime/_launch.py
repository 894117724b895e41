"""Inside-the-sandbox launcher (stdlib only, run as ``python3 -I -S _launch.py``).

Listens on ``127.0.0.1:PORT`` in the sandbox's own network namespace and pipes each
connection to the Unix socket bind-mounted from the host, whose other end is the filtering
relay; then runs the agent's argv and exits with its status (``128 + signal`` when a signal
killed it). The sandbox's PID 1 dies with this process, taking every leftover child along.

Usage: ``_launch.py PORT SOCKET -- ARGV...`` (``PORT`` 0: no relay, just run ARGV; no
ARGV: only relay, until killed, as a container's main process).

The relay is one thread polling every socket, started before the agent: it needs no new
thread, process or file per connection beyond the two sockets, so an agent that exhausts
its process limit (a fork bomb) cannot stop it. When it cannot take a connection (out of
descriptors, the host end refusing), the client gets a ``503`` naming why at once, and a
``tracewire sandbox relay:`` line goes to stderr, which the host records with the result.

It uses the C modules (``_socket``, ``_thread``, ``_signal``, ``select``) rather than
``socket``, ``threading`` and ``signal``: those import ``enum`` and friends, ~30 ms of
every command's start on a loaded machine, and this runs once per command.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # no stub; `signal` itself is slow
import _socket
import _thread
import errno
import os
import select
import sys

#: Stop reading one side while this much is still waiting to be written to the other.
_HIGH_WATER = 1 << 18
#: stderr prefix of the relay's own errors (the host collects these lines).
PREFIX = "tracewire sandbox relay: "
_MAX_NOTES = 20
_IN, _OUT = select.POLLIN, select.POLLOUT


class _Relay:
    """Every connection of the sandbox, piped to the host's Unix socket by one poll loop."""

    def __init__(self, lsock: _socket.socket, path: str) -> None:
        self.lsock = lsock
        self.path = path
        self.poll = select.poll()
        self.socks: dict[int, _socket.socket] = {}
        self.peer: dict[int, int] = {}
        self.pending: dict[int, bytearray] = {}  # bytes waiting to be written to this fd
        self.eof: set[int] = set()  # fds whose read side has ended
        self.shut: set[int] = set()  # fds whose write side we shut (or that failed)
        self.dead: set[int] = set()  # fds a write failed on: what is for them is dropped
        self.dropped: dict[int, int] = {}  # bytes read and dropped, per fd
        self.clients: set[int] = set()  # the accepted (agent) side of each pair
        self.registered: dict[int, int] = {}
        self.notes = 0
        self.paused = False
        # A descriptor kept in reserve: when accept fails for want of descriptors, closing
        # it lets the connection be taken and answered instead of waiting in the backlog.
        self.spare: int | None = self._open_spare()
        lsock.setblocking(False)
        self.poll.register(lsock.fileno(), _IN)

    @staticmethod
    def _open_spare() -> int | None:
        try:
            return os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None

    def note(self, why: str) -> None:
        """One stderr line per failure (bounded, so a flood cannot fill the output)."""
        self.notes += 1
        if self.notes <= _MAX_NOTES:
            line = PREFIX + why + ("" if self.notes < _MAX_NOTES else " (further ones "
                                                                      "not shown)")
            try:
                os.write(2, (line + "\n").encode("utf-8", "replace"))
            except OSError:
                pass

    # -- connections -------------------------------------------------------------------
    def accept(self) -> None:
        while True:
            try:
                fd, _ = self.lsock._accept()  # type: ignore[attr-defined]  # an fd
            except BlockingIOError:
                return
            except InterruptedError:
                continue
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE) and self.spare is not None:
                    os.close(self.spare)
                    self.spare = None
                    self._refuse_next(f"out of file descriptors ({exc.strerror})")
                    self.spare = self._open_spare()
                    continue
                if exc.errno == errno.ECONNABORTED:
                    continue
                self.note(f"cannot accept a connection: {exc}")
                self.pause()
                return
            self.start(fd)

    def _refuse_next(self, why: str) -> None:
        try:
            fd, _ = self.lsock._accept()  # type: ignore[attr-defined]
        except OSError:
            self.pause()
            return
        self.refuse(_socket.socket(_socket.AF_INET, _socket.SOCK_STREAM, 0, fd), why)

    def pause(self) -> None:
        # Stop polling the listener for a moment rather than spin on a failing accept.
        if not self.paused:
            self.paused = True
            self.poll.unregister(self.lsock.fileno())

    def resume(self) -> None:
        if self.paused:
            self.paused = False
            self.poll.register(self.lsock.fileno(), _IN)

    def refuse(self, conn: _socket.socket, why: str) -> None:
        """Answer ``503`` with the reason and close: the model call fails now, not later."""
        self.note(why)
        body = (PREFIX + why).encode("utf-8", "replace")
        try:
            conn.setblocking(False)
            conn.send(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
                      b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
        except OSError:
            pass
        conn.close()

    def start(self, fd: int) -> None:
        conn = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM, 0, fd)
        try:
            up = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        except OSError as exc:
            self.refuse(conn, f"cannot open a socket to the host: {exc}")
            return
        try:
            up.setblocking(False)
            up.connect(self.path)  # a Unix socket connects at once or fails (EAGAIN: full)
        except OSError as exc:
            up.close()
            self.refuse(conn, f"cannot reach the host end of the relay: {exc}")
            return
        conn.setblocking(False)
        try:
            conn.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
        except OSError:
            pass
        a, b = conn.fileno(), up.fileno()
        self.socks[a], self.socks[b] = conn, up
        self.peer[a], self.peer[b] = b, a
        self.pending[a], self.pending[b] = bytearray(), bytearray()
        self.clients.add(a)
        self.update(a)
        self.update(b)

    def close_pair(self, fd: int) -> None:
        for x in (fd, self.peer.get(fd)):
            if x is None or x not in self.socks:
                continue
            if x in self.registered:
                del self.registered[x]
                self.poll.unregister(x)
            self.socks.pop(x).close()
            self.peer.pop(x, None)
            self.pending.pop(x, None)
            self.eof.discard(x)
            self.shut.discard(x)
            self.dead.discard(x)
            self.dropped.pop(x, None)
            self.clients.discard(x)
        if self.paused:
            self.resume()  # a descriptor was freed: try the listener again

    def update(self, fd: int) -> None:
        """Poll ``fd`` for what it can do now; close the pair once both ways are done
        (each side's read ended and its write side shut)."""
        if fd not in self.socks:
            return
        peer = self.peer[fd]
        mask = 0
        if fd not in self.eof and (peer in self.dead or len(self.pending[peer]) < _HIGH_WATER):
            mask |= _IN
        if self.pending[fd]:
            mask |= _OUT
        elif peer in self.eof and fd not in self.shut:
            # Everything the other side sent has been written: pass its EOF on.
            self.shut.add(fd)
            try:
                self.socks[fd].shutdown(_socket.SHUT_WR)
            except OSError:
                pass
        if fd in self.shut and peer in self.shut and fd in self.eof and peer in self.eof:
            self.close_pair(fd)
            return
        if mask == 0:
            if fd in self.registered:
                del self.registered[fd]
                self.poll.unregister(fd)
        elif self.registered.get(fd) != mask:
            if fd in self.registered:
                self.poll.modify(fd, mask)
            else:
                self.poll.register(fd, mask)
            self.registered[fd] = mask

    def _write_failed(self, fd: int) -> None:
        # Nothing more reaches ``fd``; what it still sends (the host's 403 after refusing
        # a request whose body is still coming) is delivered, and what is sent to it is
        # read and dropped, so closing never resets a client before it reads the answer.
        self.dead.add(fd)
        self.shut.add(fd)
        self.pending[fd].clear()

    def on_event(self, fd: int, ev: int) -> None:
        sock = self.socks[fd]
        peer = self.peer[fd]
        if ev & (_OUT | select.POLLHUP | select.POLLERR) and self.pending[fd]:
            try:
                n = sock.send(self.pending[fd])
                del self.pending[fd][:n]
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                if fd in self.clients:
                    self.close_pair(fd)  # the agent's side is gone: nobody to answer
                    return
                self._write_failed(fd)
        if ev & (_IN | select.POLLHUP | select.POLLERR) and fd not in self.eof:
            try:
                data = sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                data = None
            except OSError:
                data = b""  # reset: its read side is over (a write to it will fail too)
            if data is not None:
                if not data:
                    self.eof.add(fd)
                elif peer in self.dead:
                    self.dropped[fd] = self.dropped.get(fd, 0) + len(data)
                    if self.dropped[fd] > _HIGH_WATER * 4:
                        self.eof.add(fd)  # enough lingering: give up on its EOF
                else:
                    self.pending[peer] += data
        elif ev & select.POLLERR:
            if fd in self.clients:
                self.close_pair(fd)
                return
            self.eof.add(fd)
            self._write_failed(fd)
        self.update(fd)
        self.update(peer)

    def run(self) -> None:
        lfd = self.lsock.fileno()
        while True:
            try:
                events = self.poll.poll(200 if self.paused else None)
            except InterruptedError:
                continue
            if self.paused and not events:
                self.resume()
            for fd, ev in events:
                if fd == lfd:
                    self.accept()
                elif fd in self.socks:
                    self.on_event(fd, ev)


def _relay_forever(lsock: _socket.socket, path: str) -> None:
    relay = _Relay(lsock, path)
    while True:
        try:
            relay.run()
        except MemoryError:
            relay.note("out of memory; dropping every open connection")
            for fd in list(relay.socks):
                relay.close_pair(fd)


def main(argv: list[str]) -> int:
    """Start the relay (when asked), run the agent, return its exit status."""
    if len(argv) < 3 or argv[2] != "--":
        sys.stderr.write("usage: _launch.py PORT SOCKET -- ARGV...\n")
        return 2
    port, path, cmd = int(argv[0]), argv[1], argv[3:]
    if port:
        lsock = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
        lsock.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
        try:
            lsock.bind(("127.0.0.1", port))
            lsock.listen(128)
        except OSError as exc:
            # E.g. a port below 1024: the sandbox holds no capability to bind it.
            sys.stderr.write(f"{PREFIX}cannot listen on 127.0.0.1:{port}: {exc}\n")
            return 126
        _thread.start_new_thread(_relay_forever, (lsock, path))
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
