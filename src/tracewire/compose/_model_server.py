"""The model server an eval talks to: a given OpenAI-compatible one, or the built-in model
started here as a child process."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import tempfile
from collections.abc import AsyncIterator
from typing import IO

import aiohttp

from .._children import die_with_parent
from .._errors import EnvError, UpstreamError
from ..model import MODEL_NAME

__all__ = ["builtin_model", "check_model", "model_server"]


async def check_model(base_url: str, api_key: str | None, model: str | None) -> str:
    """Reach ``{base_url}/models``; returns the model to use. Raises UpstreamError."""
    url = base_url.rstrip("/") + "/models"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        timeout = aiohttp.ClientTimeout(total=10)
        async with (
            aiohttp.ClientSession(timeout=timeout) as http,
            http.get(url, headers=headers) as resp,
        ):
            if resp.status >= 400:
                if model is not None:
                    return model  # some servers have no /models; the name is given
                raise UpstreamError(f"model server at {base_url} answered {resp.status}")
            body = await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise UpstreamError(f"cannot reach the model server at {base_url}: {exc}") from exc
    if model is not None:
        return model
    try:
        return str(body["data"][0]["id"])
    except (KeyError, IndexError, TypeError) as exc:
        raise UpstreamError(f"{url} lists no model; pass --model") from exc


@contextlib.asynccontextmanager
async def model_server(
    base_url: str | None,
    model: str | None,
    api_key: str | None,
    *,
    seed: int = 0,
    max_model_len: int | None = None,
) -> AsyncIterator[tuple[str, str]]:
    """(base_url, model) of the model server: the given one, or the built-in one started here
    (with ``seed`` and ``max_model_len``)."""
    if base_url is not None:
        yield base_url, await check_model(base_url, api_key, model)
        return
    async with builtin_model(seed, max_model_len) as url:
        yield url, model or MODEL_NAME


@contextlib.asynccontextmanager
async def builtin_model(seed: int, max_model_len: int | None = None) -> AsyncIterator[str]:
    """Run the built-in model as a child process (``tracewire model --port 0``), like a real
    inference server: its sampling then competes with the rollouts for a core, not for this
    process's GIL and event loop."""
    argv = [sys.executable, "-m", "tracewire", "model", "--port", "0", "--seed", str(seed)]
    if max_model_len is not None:
        argv += ["--max-model-len", str(max_model_len)]
    # stderr goes to a file, not a pipe nobody drains (a chatty child would block on it).
    errfile = await asyncio.to_thread(tempfile.TemporaryFile)
    # die_with_parent: an eval that is SIGKILLed leaves no model server behind.
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=errfile, preexec_fn=die_with_parent
    )
    try:
        assert proc.stdout is not None
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), timeout=60)
        except TimeoutError:
            line = b""
        url = line.decode().strip()
        if not url.startswith("http://"):
            err = await asyncio.to_thread(_tail, errfile)
            raise EnvError(f"the built-in model did not start: {err}")
        yield url
    finally:
        errfile.close()
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), timeout=10)
            except TimeoutError:
                proc.kill()
                await proc.wait()


def _tail(f: IO[bytes]) -> str:
    f.seek(0)
    return f.read()[-2000:].decode(errors="replace").strip()
