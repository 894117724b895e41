"""Errors cross process boundaries as {type, message, reason} and come back as themselves."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tracewire import (
    BusyError,
    HookError,
    LimitError,
    ProxyError,
    ServeError,
    SessionError,
    StoreError,
    TracewireError,
)
from tracewire._wire_errors import error_body, error_from_body
from tracewire.sessions import GoneReason


@pytest.mark.parametrize("exc", [SessionError("gone", reason=GoneReason.EXPIRED),
                                 HookError("hook p raised"), LimitError("too big"),
                                 BusyError("full"), StoreError("disk")])
def test_round_trip_keeps_class_message_and_reason(exc: TracewireError) -> None:
    back = error_from_body(error_body(exc))
    assert type(back) is type(exc) and str(back) == str(exc)
    assert getattr(back, "reason", None) == getattr(exc, "reason", None)


def test_unknown_or_unlisted_types_fall_back_to_the_default() -> None:
    e = error_from_body({"type": "Weird", "message": "m"}, "at x", default=ProxyError)
    assert type(e) is ProxyError and str(e) == "Weird: m (at x)"
    e = error_from_body(error_body(StoreError("disk")), default=ServeError, known=(BusyError,))
    assert type(e) is ServeError and "StoreError: disk" in str(e)
    assert error_body(SessionError("x", reason="deleted"), i=3) == {
        "type": "SessionError", "message": "x", "reason": "deleted", "i": 3}


def test_samples_and_sessions_client_import_no_server() -> None:
    # A trainer imports these: samples needs no aiohttp; the client needs no proxy server.
    code = ("import sys, tracewire.samples; assert 'aiohttp' not in sys.modules; "
            "import tracewire.sessions; assert 'tracewire.proxy' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
