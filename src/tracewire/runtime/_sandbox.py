"""What the two sandboxes (``bwrap`` and ``docker``) share: the agent's ``/workspace``, a
private state directory on the host that holds it and the relay's socket, the relay itself
(the sandbox's only way out), and the in-sandbox launcher's command line."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ._api import ProxyEndpoint, Runtime, SandboxError
from ._relay import SessionRelay

__all__ = ["INSIDE_RUN", "INSIDE_WORKDIR", "LAUNCH", "SIGNAL_LIMITS", "SandboxRuntime"]

#: The workdir as the agent sees it (also its ``HOME``).
INSIDE_WORKDIR = "/workspace"
#: Where the relay's socket and the launcher are mounted read-only.
INSIDE_RUN = "/run/tracewire"
#: The launcher script (stdlib only) copied into the state directory's ``run/``.
LAUNCH = Path(__file__).with_name("_launch.py")
#: Exit status ``128+N`` of a command killed by SIGXCPU/SIGXFSZ: the rlimit that fired.
SIGNAL_LIMITS = {128 + 24: "cpu", 128 + 25: "file"}


class SandboxRuntime(Runtime):
    """A runtime whose agent runs isolated and reaches its proxy session only through a
    :class:`SessionRelay` on ``run/proxy.sock`` in the runtime's state directory.

    Subclasses set ``_state`` in ``_boot`` (and ``_work``, the workdir's place below it),
    call :meth:`_start_relay` once ``run/`` exists and :meth:`_stop_relay` in ``_close``.
    """

    workdir = INSIDE_WORKDIR
    #: The host workdir's path below the state directory.
    _work: tuple[str, ...] = ("work",)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._state: Path | None = None
        self._relay: SessionRelay | None = None

    @property
    def relay(self) -> SessionRelay | None:
        """The host end of the proxy relay (None without an endpoint, or once closed)."""
        return self._relay

    @property
    def agent_endpoint(self) -> ProxyEndpoint | None:
        """The session at ``127.0.0.1:<proxy port>`` on the sandbox's own loopback."""
        return self.endpoint.on_loopback() if self.endpoint is not None else None

    def host_workdir(self) -> Path:
        """Where ``/workspace`` lives on the host (valid between boot and close)."""
        if self._state is None:
            raise SandboxError(f"{self.name} runtime not booted")
        return self._state.joinpath(*self._work)

    async def _start_relay(self) -> None:
        """Serve the session on ``run/proxy.sock`` (without an endpoint nothing is: the
        launcher then listens on no port, and the sandbox has no way out at all)."""
        assert self._state is not None
        if self.endpoint is not None:
            self._relay = SessionRelay(self.endpoint, self._state / "run" / "proxy.sock")
            await self._relay.start()

    async def _stop_relay(self) -> None:
        if self._relay is not None:
            await self._relay.stop()
            self._relay = None

    @staticmethod
    def inside(cwd: str | None) -> str:
        """``cwd`` as a path inside the sandbox: absolute ones as they are, relative ones
        (and None) below the workdir."""
        return cwd if cwd and cwd.startswith("/") else os.path.join(INSIDE_WORKDIR, cwd or "")

    def launcher_args(self) -> list[str]:
        """The launcher's arguments after the interpreter, up to and including the ``--``
        that the agent's argv follows: it listens on the proxy's port inside the
        sandbox and pipes each connection to the relay's socket."""
        port = self.endpoint.port if self.endpoint is not None else 0
        return ["-I", "-S", f"{INSIDE_RUN}/launch.py", str(port), f"{INSIDE_RUN}/proxy.sock",
                "--"]
