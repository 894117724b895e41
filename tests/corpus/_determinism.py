"""The corpus's normalisation: a fixed wall clock and seeded random ids, installed in the
generating process before tracewire is imported.

tracewire has no clock or id hook, and everything it records reads ``time.time()`` (spans,
node and error timestamps, the store's ``written``/``started`` times) and ``uuid.uuid4()``
(trace, episode, session and group ids; the built-in model's reply and tool-call ids; the
Anthropic/Responses item ids). So the generator replaces exactly those two functions, plus
``secrets.token_bytes`` (session secrets, worker ids) so that nothing differs from run to run,
and the date chat templates print (:func:`fix_template_dates`: the llama3 fixture's system
header says "Today Date: ...", so its bytes changed every day), and nothing else: no
record, frame or payload is rewritten or dropped afterwards (the
generator names the few exceptions where it makes them). Durations come out 0 (every
``time.time()`` is :data:`T0`); ``time.monotonic``/``perf_counter`` (which asyncio, timeouts
and pacing use) are left alone, and no recorded field reads them.

Ids come from seeded ``random.Random`` *streams*, re-seeded by :func:`reseed` right before
each corpus case runs (after its model server is up), so adding a case never shifts
another. There is one stream per (thread, drawer, kind): the thread's name with digits
folded (``MainThread``, ``tracewire-model``, ``asyncio_N``), whether the code drawing is
tracewire's or a library's (an SDK's idempotency keys), and uuid or secret. So the
proxy drawing one more id never moves the ids the model thread draws, nor an SDK upgrade
any of tracewire's. The generator imports every library first, so no import-time draw
lands inside a case.
"""

from __future__ import annotations

import datetime
import hashlib
import random
import re
import secrets
import sys
import threading
import time
import uuid

__all__ = ["T0", "fix_template_dates", "install", "reseed"]

#: The fixed wall clock: 2026-01-01T00:00:00Z.
T0 = 1_767_225_600.0

_lock = threading.Lock()
_label = ""
_streams: dict[tuple[str, str, str], random.Random] = {}
_installed = False
#: Modules whose frames are skipped when finding who draws.
_PLUMBING = {"uuid", "secrets", "random", __name__}


def _stream(kind: str) -> random.Random:
    thread = re.sub(r"\d+", "N", threading.current_thread().name)
    frame = sys._getframe(2)
    while frame is not None and frame.f_globals.get("__name__") in _PLUMBING:
        frame = frame.f_back  # type: ignore[assignment]
    module = "" if frame is None else str(frame.f_globals.get("__name__", ""))
    owner = "tracewire" if module.split(".")[0] == "tracewire" else "library"
    key = (thread, owner, kind)
    rng = _streams.get(key)
    if rng is None:
        seed = hashlib.blake2b("\0".join((_label, *key)).encode(), digest_size=8).digest()
        rng = _streams[key] = random.Random(int.from_bytes(seed, "little"))
    return rng


def _time() -> float:
    return T0


def _time_ns() -> int:
    return int(T0) * 1_000_000_000


def _uuid4() -> uuid.UUID:
    with _lock:
        bits = _stream("uuid").getrandbits(128)
    return uuid.UUID(int=bits, version=4)


def _token_bytes(nbytes: int | None = None) -> bytes:
    with _lock:
        return _stream("secret").randbytes(32 if nbytes is None else nbytes)


def reseed(label: str) -> None:
    """Restart every id stream for the corpus case named ``label``."""
    global _label
    with _lock:
        _label = label
        _streams.clear()


def install() -> None:
    """Replace the clock and id sources (idempotent). Call before importing tracewire, so a
    ``from time import time`` anywhere also gets the fixed clock."""
    global _installed
    if _installed:
        return
    time.time = _time
    time.time_ns = _time_ns
    uuid.uuid4 = _uuid4
    secrets.token_bytes = _token_bytes
    _installed = True


class _FixedDatetime(datetime.datetime):
    """A ``datetime`` whose ``now()`` is :data:`T0` (in UTC, naive unless asked for a zone)."""

    @classmethod
    def now(cls, tz: datetime.tzinfo | None = None) -> _FixedDatetime:
        at = cls.fromtimestamp(T0, datetime.UTC)
        return at.replace(tzinfo=None) if tz is None else at.astimezone(tz)


def fix_template_dates() -> None:
    """Make transformers' chat-template ``strftime_now`` read the fixed clock (it reads
    ``datetime.now()``, which the clock patch above does not reach). Call once
    transformers is imported; a no-op without it."""
    try:
        from transformers.utils import chat_template_utils
    except ImportError:
        return
    chat_template_utils.datetime = _FixedDatetime  # type: ignore[attr-defined,misc]
