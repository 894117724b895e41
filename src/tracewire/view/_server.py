"""ViewServer: runs the viewer app on a loopback port."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType

from aiohttp import web

from ._app import SOURCE, build_app
from ._source import RunSource

__all__ = ["ViewServer"]


class ViewServer:
    """The web viewer of one run (``compare``: runs offered for run-against-run):
    ``await start()``, ``.url``, ``await stop()``."""

    def __init__(
        self,
        run_dir: str | Path,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        poll_interval: float = 0.25,
        compare: Sequence[str | Path] = (),
    ) -> None:
        self.run_dir = Path(run_dir)
        self.compare = [Path(p) for p in compare]
        self.host = host
        self.port = port
        self.poll_interval = poll_interval
        self.app: web.Application | None = None
        #: The event loop serving (set by :meth:`start`; benches watch it for stalls).
        self.loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None

    @property
    def source(self) -> RunSource:
        """The running app's read access to the run (its episode table is ``.index``)."""
        if self.app is None:
            raise RuntimeError("the viewer is not started")
        return self.app[SOURCE]

    @property
    def url(self) -> str:
        """``http://HOST:PORT`` once started."""
        if self._runner is None:
            raise RuntimeError("the viewer is not started")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> None:
        """Bind and start serving (port 0 picks a free port, reflected in ``.url``)."""
        self.loop = asyncio.get_running_loop()
        self.app = build_app(self.run_dir, poll_interval=self.poll_interval,
                             compare=self.compare)
        # Open event streams never end by themselves: do not wait a minute for them on stop.
        runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=2.0)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        await site.start()
        self._runner = runner
        # Open the run (recovery may run) and load the table before the first page is asked.
        await asyncio.to_thread(self.app[SOURCE].warm)
        # Port 0 asks the OS for a free port: read back the one it gave.
        for addr in runner.addresses:
            if isinstance(addr, tuple) and len(addr) >= 2:
                self.port = int(addr[1])
                break

    async def stop(self) -> None:
        """Close open streams and stop serving."""
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def __aenter__(self) -> ViewServer:
        await self.start()
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    @classmethod
    @contextmanager
    def run_in_thread(cls, run_dir: str | Path, **kwargs: object) -> Iterator[ViewServer]:
        """Serve from a background thread with its own event loop (for synchronous code such
        as browser tests); stops when the block ends."""
        server = cls(run_dir, **kwargs)  # type: ignore[arg-type]
        loop = asyncio.new_event_loop()
        started = threading.Event()
        error: list[BaseException] = []

        def main() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(server.start())
            except BaseException as exc:
                error.append(exc)
                started.set()
                return
            started.set()
            loop.run_forever()
            loop.run_until_complete(server.stop())
            loop.close()

        thread = threading.Thread(target=main, name="tracewire-view", daemon=True)
        thread.start()
        started.wait()
        if error:
            raise error[0]
        try:
            yield server
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)
