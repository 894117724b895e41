"""Per-session sample state behind the session API: a :class:`SampleBuilder` per live
session and the last payload collected for each, kept for repeats (no HTTP here).

Collect is idempotent: the same request repeated while the trace is unchanged, or after the
session was deleted or expired (within ``grace_s``), gets the same payload back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Container
from dataclasses import dataclass
from typing import Any

import orjson

from .._errors import LimitError
from ..samples import (
    Picker,
    Postprocess,
    SampleBuilder,
    default_picker,
    default_postprocess,
    encode_parts,
)
from ..trace import InfoKey
from ._session import Session

__all__ = ["Payload", "SampleCollector"]

#: A samples payload as buffers: views of the trace's append-only columns plus the few
#: arrays assembly made, so keeping one for repeats costs (almost) no extra memory.
Payload = list[bytes | memoryview]

_BYTES_PER_TOKEN = 9  # int32 id + uint8 mask + float32 logprob


@dataclass(slots=True)
class _Collected:
    key: bytes
    version: tuple[int, ...]
    parts: Payload
    closed_at: float | None = None


class SampleCollector:
    """The sample state of one proxy's sessions: builders, the last payload per session,
    the hooks and the payload cap. Attributes may be changed before or while serving."""

    def __init__(
        self,
        *,
        picker: Picker | None = default_picker,
        postprocess: Postprocess | None = default_postprocess,
        max_payload_bytes: int = 4 << 30,
        grace_s: float = 300.0,
    ) -> None:
        self.picker = picker
        self.postprocess = postprocess
        #: Largest samples payload built for one collect; bigger raises ``LimitError``.
        self.max_payload_bytes = max_payload_bytes
        #: How long a collected payload is still served after DELETE or expiry.
        self.grace_s = grace_s
        self.builders: dict[str, SampleBuilder] = {}
        self.collected: dict[str, _Collected] = {}

    def builder(self, session: Session) -> SampleBuilder:
        """The session's builder, created on first use (catching up on an existing trace
        happens in the collect's worker thread, not here on the loop)."""
        b = self.builders.get(session.id)
        if b is None or b.trace is not session.trace:
            if b is not None:
                b.close()
            b = SampleBuilder(session.trace).attach(catch_up=False)
            self.builders[session.id] = b
        return b

    async def summary(self, session: Session) -> dict[str, Any]:
        """The builder's counts of the session's trace (worked out in a thread)."""
        return await asyncio.to_thread(self.builder(session).summary)

    def has_collected(self, session_id: str) -> bool:
        """Whether a payload of ``session_id`` is kept."""
        return session_id in self.collected

    @staticmethod
    def request_key(max_seq_len: int | None, overrides: dict[str, Any]) -> bytes:
        """What makes two collect requests the same request."""
        return orjson.dumps([max_seq_len, overrides], option=orjson.OPT_SORT_KEYS)

    def kept(self, session_id: str, key: bytes, now: float | None = None) -> Payload | None:
        """The payload of a session that is gone, when the same request collected it and
        the grace period since the session closed has not run out."""
        c = self.collected.get(session_id)
        if c is None or c.key != key:
            return None
        now = time.time() if now is None else now
        if c.closed_at is not None and now - c.closed_at > self.grace_s:
            return None
        return c.parts

    async def collect(
        self, session: Session, max_seq_len: int | None, overrides: dict[str, Any]
    ) -> Payload:
        """The samples payload of a live session: the kept one when the request and the
        trace are unchanged, else assembled afresh in a worker thread and kept."""
        key = self.request_key(max_seq_len, overrides)
        builder = self.builder(session)
        trace = session.trace
        # Same trace and same hooks → same answer; anything else is assembled afresh.
        version = (
            len(trace.nodes),
            len(trace.calls),
            len(trace.columns),
            id(self.picker),
            id(self.postprocess),
        )
        cached = self.collected.get(session.id)
        if cached is not None and cached.key == key and cached.version == version:
            return cached.parts
        parts = await asyncio.to_thread(self.assemble, session, builder, max_seq_len, overrides)
        self.collected[session.id] = _Collected(key=key, version=version, parts=parts)
        return parts

    def assemble(
        self,
        session: Session,
        builder: SampleBuilder,
        max_seq_len: int | None,
        overrides: dict[str, Any],
    ) -> Payload:
        """Assemble and encode the session's samples (blocking: hooks run here, so call it
        from a worker thread); ``LimitError`` past ``max_payload_bytes``."""
        candidates = builder.candidates()
        samples = builder.samples(
            max_seq_len=max_seq_len,
            picker=self.picker,
            postprocess=self.postprocess,
            metadata=session.metadata,
            computed={"session_id": session.id},
            overrides=overrides,
            group_id=session.group_id,
            group_index=session.group_index,
        )
        size = sum(int(s.tokens.shape[0]) for s in samples) * _BYTES_PER_TOKEN
        if size > self.max_payload_bytes:
            raise LimitError(
                f"samples payload of ~{size} bytes is over max_payload_bytes="
                f"{self.max_payload_bytes}; pass a smaller max_seq_len"
            )
        kept = {s.leaf for s in samples}
        info = {
            "session_id": session.id,
            "group_id": session.group_id,
            "group_index": session.group_index,
            "trace_id": session.trace.id,
            "turns": builder.summary()["turns"],
            "token_mismatches": session.trace.info.get(InfoKey.TOKEN_MISMATCHES, 0),
            "max_seq_len": max_seq_len,
            "dropped_leaves": [leaf for leaf in candidates if leaf not in kept],
        }
        return encode_parts(samples, info=info)

    def closed(self, session_id: str, now: float | None = None) -> None:
        """The session was deleted: drop its builder, start its payload's grace period."""
        b = self.builders.pop(session_id, None)
        if b is not None:
            b.close()
        c = self.collected.get(session_id)
        if c is not None and c.closed_at is None:
            c.closed_at = time.time() if now is None else now

    def sweep(self, live: Container[str], now: float | None = None) -> None:
        """Forget builders of sessions not in ``live`` and payloads past their grace."""
        now = time.time() if now is None else now
        for sid in [sid for sid in self.builders if sid not in live]:
            self.builders.pop(sid).close()
        for sid, c in list(self.collected.items()):
            if sid in live:
                continue
            if c.closed_at is None:
                c.closed_at = now
            elif now - c.closed_at > self.grace_s:
                del self.collected[sid]

    def close(self) -> None:
        """Detach every builder (the proxy is stopping)."""
        for b in self.builders.values():
            b.close()
        self.builders.clear()
