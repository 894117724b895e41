"""The trainer token from a 0600 file named by TRACEWIRE_SESSION_TOKEN_FILE, on both sides:
a real proxy takes it as its token, and the trainer's SessionClient authenticates with it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tracewire import ProxyError
from tracewire.proxy import Proxy
from tracewire.sessions import TOKEN_ENV, TOKEN_FILE_ENV, SessionClient, token_from_env

DEAD_UPSTREAM = "http://127.0.0.1:9/v1"  # the session API never calls the upstream


def _token_file(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "token"
    path.write_text(text)
    path.chmod(mode)
    return path


async def test_proxy_and_client_share_a_token_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.setenv(TOKEN_FILE_ENV, str(_token_file(tmp_path, "tws-from-file\n")))
    assert token_from_env() == "tws-from-file"
    async with Proxy(DEAD_UPSTREAM) as proxy:
        assert proxy.session_token == "tws-from-file"
        async with SessionClient(proxy.url) as client:
            info = await client.create()
            assert proxy.registry.get(info.id) is not None
        # Without it the same request is refused: the file really was the credential.
        async with SessionClient(proxy.url, token="wrong") as client:
            with pytest.raises(ProxyError):
                await client.create()


def test_a_group_readable_or_multi_line_file_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.setenv(TOKEN_FILE_ENV, str(_token_file(tmp_path, "tws-x\n", 0o644)))
    with pytest.raises(ProxyError, match="readable by group or others"):
        token_from_env()
    monkeypatch.setenv(TOKEN_FILE_ENV, str(_token_file(tmp_path, "a\nb\n")))
    with pytest.raises(ProxyError, match="one token on one line"):
        token_from_env()
    monkeypatch.setenv(TOKEN_FILE_ENV, str(tmp_path / "missing"))
    with pytest.raises(ProxyError, match="cannot read"):
        token_from_env()
