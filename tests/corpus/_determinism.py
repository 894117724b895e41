"""The corpus's only normalisation: a fixed wall clock and seeded random ids, installed in the
generating process before tracewire is imported.

tracewire has no clock or id hook, and everything it records reads ``time.time()`` (spans,
node and error timestamps, the store's ``written``/``started`` times) and ``uuid.uuid4()``
(trace, episode, session and group ids; the built-in model's reply and tool-call ids; the
Anthropic/Responses item ids). So the generator replaces exactly those two functions, plus
``secrets.token_bytes`` (session secrets, worker ids) so that nothing differs from run to run,
and nothing else: no record, frame or payload is rewritten or dropped afterwards. Durations
come out 0 (every ``time.time()`` is :data:`T0`); ``time.monotonic``/``perf_counter`` (which
asyncio, timeouts and pacing use) are left alone, and no recorded field reads them.

Ids come from a ``random.Random`` re-seeded by :func:`reseed` right before each corpus case
runs (after its model server is up), so adding a case or a stray id call in one case never
shifts another; secrets draw from a second one. The generator imports every library first,
so no import-time id draw lands inside a case.
"""

from __future__ import annotations

import hashlib
import random
import secrets
import threading
import time
import uuid

__all__ = ["T0", "install", "reseed"]

#: The fixed wall clock: 2026-01-01T00:00:00Z.
T0 = 1_767_225_600.0

_lock = threading.Lock()
_rng = random.Random(0)
#: Secrets (session secrets, worker ids, a module's import-time sentinel) are never
#: recorded: their own stream, so code that draws one more or one fewer shifts no id.
_secret_rng = random.Random(0)
_installed = False


def _time() -> float:
    return T0


def _time_ns() -> int:
    return int(T0) * 1_000_000_000


def _uuid4() -> uuid.UUID:
    with _lock:
        bits = _rng.getrandbits(128)
    return uuid.UUID(int=bits, version=4)


def _token_bytes(nbytes: int | None = None) -> bytes:
    with _lock:
        return _secret_rng.randbytes(32 if nbytes is None else nbytes)


def reseed(label: str) -> None:
    """Restart the id stream for the corpus case named ``label``."""
    seed = int.from_bytes(hashlib.blake2b(label.encode(), digest_size=8).digest(), "little")
    with _lock:
        _rng.seed(seed)
        _secret_rng.seed(seed ^ 0x5EC2E7)


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
