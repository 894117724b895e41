"""The aiohttp application and :class:`ModelServer` (in-process, or on a background thread)."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import orjson
from aiohttp import web

from .._errors import ModelError
from ._chat import Shared, chat_completions, maybe_thread
from ._completions import completions
from ._engine import get_engine
from ._foreign import ForeignModel
from ._foreign_chat import foreign_chat, render_foreign
from ._policy import Policy
from ._protocol import (
    MAX_MODEL_LEN,
    MAX_MODEL_LEN_LIMIT,
    MODEL_NAME,
    RequestError,
    Validated,
    error_body,
)
from ._template import ChatTemplate
from ._tokenin import sglang_generate, vllm_generate

__all__ = ["ModelServer", "ServerThread"]

log = logging.getLogger(__name__)

#: Largest request body accepted (bytes); larger ones get 413.
MAX_BODY = 8 * 1024 * 1024
#: Requests handled at once; more get 429 right away (bounded, no hidden queue).
MAX_INFLIGHT = 256
DESCRIPTION = ("Tiny n-gram demo model built into tracewire for tests and demos. Not a useful "
               "assistant: it only knows the bundled environments' tasks.")

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_SHARED: web.AppKey[Shared] = web.AppKey("shared", Shared)
_INFLIGHT: web.AppKey[list[int]] = web.AppKey("inflight", list)


def _error(status: int, message: str, type_: str, param: str | None = None,
           code: str | None = None) -> web.Response:
    return web.Response(status=status, content_type="application/json",
                        body=orjson.dumps(error_body(message, type_, param, code)))


@web.middleware
async def _errors(request: web.Request, handler: _Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except RequestError as exc:
        return _error(exc.status, str(exc), exc.type, exc.param, exc.code)
    except ModelError as exc:
        return _error(400, str(exc), "invalid_request_error")
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        kind = "not_found_error" if exc.status == 404 else "invalid_request_error"
        return _error(exc.status, exc.reason, kind, None, None)
    except (ConnectionResetError, asyncio.CancelledError):
        raise
    except Exception as exc:  # the server must keep serving; report, don't crash
        log.exception("model server: unexpected error")
        return _error(500, f"internal error: {type(exc).__name__}", "server_error")


async def _json(request: web.Request) -> Any:
    raw = await request.read()  # bounded by client_max_size -> 413
    try:
        return await maybe_thread(len(raw) // 4, lambda: orjson.loads(raw))
    except orjson.JSONDecodeError as exc:
        raise RequestError(f"request body is not valid JSON: {exc}") from exc


def _bounded(fn: Callable[[web.Request, Shared, Any], Awaitable[web.StreamResponse]]) -> _Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        inflight = request.app[_INFLIGHT]
        if inflight[0] >= MAX_INFLIGHT:
            raise RequestError("server busy: too many requests in flight", None, 429,
                               "server_busy", "rate_limit_error")
        inflight[0] += 1
        try:
            return await fn(request, request.app[_SHARED], await _json(request))
        finally:
            inflight[0] -= 1
    return handler


async def _models(request: web.Request) -> web.Response:
    max_len = request.app[_SHARED].max_model_len
    return web.json_response({"object": "list", "data": [{
        "id": MODEL_NAME, "object": "model", "created": 0, "owned_by": "tracewire",
        "root": MODEL_NAME, "max_model_len": max_len, "description": DESCRIPTION}]})


async def _health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok", "model": MODEL_NAME})


async def _tokenize(request: web.Request, shared: Shared, body: Any) -> web.StreamResponse:
    v = Validated(body)
    v.model()
    if v.has("messages"):
        msgs, tools = v.body["messages"], v.body.get("tools")
        if not isinstance(msgs, list) or (tools is not None and not isinstance(tools, list)):
            raise RequestError("'messages' (and 'tools') must be lists", "messages")
        gen_prompt = v.boolean("add_generation_prompt", True)
        if shared.foreign is not None:
            ids = await render_foreign(shared.foreign, msgs, tools, gen_prompt)
        else:
            ids = await maybe_thread(sum(len(str(m)) for m in msgs),
                                     lambda: shared.template.render(msgs, tools or None,
                                                                    gen_prompt))
    elif isinstance(v.body.get("prompt"), str):
        text = v.body["prompt"]
        encode = (shared.foreign.encode_prompt if shared.foreign is not None
                  else shared.engine.tok.encode_with_special)
        ids = await maybe_thread(len(text), lambda: encode(text))
    else:
        raise RequestError("give 'prompt' (a string) or 'messages' (a list)", "prompt")
    return web.json_response({"tokens": ids, "count": len(ids),
                              "max_model_len": shared.max_model_len})


async def _detokenize(request: web.Request, shared: Shared, body: Any) -> web.StreamResponse:
    v = Validated(body)
    v.model()
    ids = v.body.get("tokens")
    if not isinstance(ids, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise RequestError("'tokens' must be a list of token ids", "tokens")
    try:
        if shared.foreign is not None:
            shared.foreign.check_ids(ids)
            text = shared.foreign.decode(ids)
        else:
            text = shared.engine.tok.decode(ids)
    except ModelError as exc:
        raise RequestError(str(exc), "tokens") from exc
    return web.json_response({"prompt": text})


def build_app(shared: Shared) -> web.Application:
    """The aiohttp application serving ``shared``'s model."""
    app = web.Application(client_max_size=MAX_BODY, middlewares=[_errors])
    app[_SHARED] = shared
    app[_INFLIGHT] = [0]
    app.router.add_get("/health", _health)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/policy/{version}/v1/models", _models)
    for root in ("/v1", "/policy/{version}/v1"):  # the latest weights, or a named version
        app.router.add_post(f"{root}/chat/completions", _bounded(
            foreign_chat if shared.foreign is not None else chat_completions))
        app.router.add_post(f"{root}/completions", _bounded(completions))
    for base in ("", "/policy/{version}"):  # token-in routes sit beside /v1, as upstream
        app.router.add_post(f"{base}/inference/v1/generate", _bounded(vllm_generate))
        app.router.add_post(f"{base}/generate", _bounded(sglang_generate))
    for prefix in ("", "/v1"):
        app.router.add_post(f"{prefix}/tokenize", _bounded(_tokenize))
        app.router.add_post(f"{prefix}/detokenize", _bounded(_detokenize))
    return app


class ModelServer:
    """The built-in OpenAI/vLLM-compatible model server; ``port=0`` picks a free port.

    ``max_model_len`` is the context (prompt + completion) in tokens; agents with long system
    prompts need more than the default 8,192. The model only looks at the last 32 tokens, so
    a longer context costs only the prompt's memory.

    ``tokenizer`` (a local directory with ``tokenizer.json`` and ``tokenizer_config.json``)
    serves that vocabulary instead of the built-in one (see ``_foreign.py``); tokens are
    then split into per-character pieces with probability ``non_canonical`` unless a request
    says otherwise (``"tracewire": {"non_canonical": p}``).
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, seed: int = 0,
                 max_model_len: int = MAX_MODEL_LEN, tokenizer: str | Path | None = None,
                 non_canonical: float = 0.0) -> None:
        if (isinstance(max_model_len, bool) or not isinstance(max_model_len, int)
                or not 1 <= max_model_len <= MAX_MODEL_LEN_LIMIT):
            raise ModelError(f"max_model_len must be an integer in 1..{MAX_MODEL_LEN_LIMIT}, "
                             f"got {max_model_len!r}")
        if (isinstance(non_canonical, bool) or not isinstance(non_canonical, int | float)
                or not 0.0 <= non_canonical <= 1.0):
            raise ModelError(f"non_canonical must be a probability in [0, 1], got "
                             f"{non_canonical!r}")
        if non_canonical and tokenizer is None:
            raise ModelError("non_canonical needs a tokenizer directory (the built-in "
                             "vocabulary samples canonically)")
        self.host, self.port, self.seed = host, port, seed
        self.max_model_len = max_model_len
        self.tokenizer = None if tokenizer is None else Path(tokenizer)
        self.non_canonical = float(non_canonical)
        self._runner: web.AppRunner | None = None
        self._shared: Shared | None = None
        self._pending: list[Policy] = []

    @property
    def base_url(self) -> str:
        """``http://HOST:PORT/v1`` (valid once started)."""
        if self._runner is None:
            raise ModelError("model server not started")
        return f"http://{self.host}:{self.port}/v1"

    async def start(self) -> None:
        """Load the model (in a thread) and start listening."""
        engine = await asyncio.to_thread(get_engine)
        foreign = (None if self.tokenizer is None
                   else await asyncio.to_thread(ForeignModel, self.tokenizer, engine))
        shared = Shared(engine, ChatTemplate(engine.tok), self.seed,
                        max_model_len=self.max_model_len, foreign=foreign,
                        non_canonical=self.non_canonical)
        self._shared = shared
        for policy in self._pending:
            self._install(shared, policy)
        self._pending.clear()
        runner = web.AppRunner(build_app(shared), access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise ModelError(f"cannot listen on {self.host}:{self.port}: {exc}") from exc
        addr = runner.addresses[0]
        self.port = int(addr[1])
        self._runner = runner

    def url_for(self, version: int) -> str:
        """Base URL whose requests sample with policy ``version`` (whatever is latest)."""
        return f"{self.base_url.removesuffix('/v1')}/policy/{version}/v1"

    def set_policy(self, policy: Policy) -> None:
        """Serve ``policy`` as the latest weights (call on the server's loop).

        Requests in flight keep the weights they started with; new requests on ``/v1`` get
        these; older versions stay reachable under :meth:`url_for` until retired.
        """
        if self._shared is None:
            self._pending.append(policy)
        else:
            self._install(self._shared, policy)

    @staticmethod
    def _install(shared: Shared, policy: Policy) -> None:
        if policy.vocab_size != shared.engine.tok.vocab_size:
            raise ModelError(f"policy covers {policy.vocab_size} ids, the vocabulary has "
                             f"{shared.engine.tok.vocab_size}")
        shared.policies[policy.version] = policy
        if shared.latest is None or policy.version >= shared.latest:
            shared.latest = policy.version

    def retire_policy(self, version: int) -> None:
        """Stop serving ``version`` by name (requests already running on it finish)."""
        if self._shared is not None and version != self._shared.latest:
            self._shared.policies.pop(version, None)

    @property
    def policy_versions(self) -> list[int]:
        """Versions served by name, oldest first."""
        return sorted(self._shared.policies) if self._shared is not None else []

    async def stop(self) -> None:
        """Stop listening and close open connections."""
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def __aenter__(self) -> ModelServer:
        await self.start()
        return self

    async def __aexit__(self, et: type[BaseException] | None, ev: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()

    @classmethod
    def run_in_thread(cls, host: str = "127.0.0.1", port: int = 0, seed: int = 0,
                      max_model_len: int = MAX_MODEL_LEN, tokenizer: str | Path | None = None,
                      non_canonical: float = 0.0) -> ServerThread:
        """Start a server on its own event loop in a daemon thread (for sync code and tests)."""
        return ServerThread(cls(host, port, seed, max_model_len, tokenizer, non_canonical))


class ServerThread:
    """A :class:`ModelServer` running on a background thread; ``stop()`` or use ``with``."""

    def __init__(self, server: ModelServer) -> None:
        self.server = server
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="tracewire-model", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self.server.start())
        except BaseException as exc:  # handed to the starting thread
            self._error = exc
            self._ready.set()
            self._loop.close()
            return
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self.server.stop())
        self._loop.close()

    @property
    def base_url(self) -> str:
        """``http://HOST:PORT/v1``."""
        return self.server.base_url

    def set_policy(self, policy: Policy, timeout: float = 10.0) -> None:
        """:meth:`ModelServer.set_policy` on the server's own loop (thread-safe)."""
        async def install() -> None:
            self.server.set_policy(policy)

        asyncio.run_coroutine_threadsafe(install(), self._loop).result(timeout)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server and join its thread."""
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout)

    def __enter__(self) -> ServerThread:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
