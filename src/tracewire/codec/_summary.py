"""A light decoder of an episode record's msgpack header: what an index row needs.

It reads ids, grouping, timing, usage, rewards and the token count, and skips nodes and
token buffers (msgpack fields a Struct does not declare are skipped unread), so the store
can index bytes received over the wire, or rebuild rows from segments, without decoding or
re-encoding the columns.
"""

from __future__ import annotations

from typing import Any

import msgspec

from .._errors import DecodeError
from ..trace import EPISODE_FIELDS

__all__ = ["CallSummary", "EpisodeSummary", "SpanSummary", "TraceSummary", "decode_summary"]


class SpanSummary(msgspec.Struct):
    """Start and end of a span."""

    start: float
    end: float | None = None


class RewardSummary(msgspec.Struct):
    """Score and weight of one reward."""

    score: float
    weight: float = 1.0


class CallSummary(msgspec.Struct):
    """Usage and span of one model call."""

    usage: dict[str, int] = {}
    span: SpanSummary | None = None


class TraceSummary(msgspec.Struct):
    """What an index row reads of a trace (its column refs give the token count)."""

    errors: list[msgspec.Raw] = []
    calls: list[CallSummary] = []
    timing: dict[str, SpanSummary] = {}
    rewards: dict[str, RewardSummary] = {}
    metrics: dict[str, float] = {}
    stop: str | None = None
    columns: dict[str, list[Any]] = {}

    @property
    def n_tokens(self) -> int:
        """Token rows of the trace, from the shape in its ``ids`` buffer reference."""
        ids = self.columns.get("ids")
        return int(ids[2][0]) if ids and len(ids) == 3 and ids[2] else 0


class EpisodeSummary(msgspec.Struct, tag="episode"):
    """What an index row reads of an episode (a subset of ``EpisodeHeader``'s fields)."""

    id: str
    env: str = ""
    task_key: str = ""
    group_id: str | None = None
    group_index: int = 0
    run: str = ""
    ok: bool = True
    errors: list[msgspec.Raw] = []
    timing: dict[str, SpanSummary] = {}
    info: dict[str, Any] = {}
    traces: list[TraceSummary] = []


if not set(EpisodeSummary.__struct_fields__) <= {*EPISODE_FIELDS, "traces"}:
    raise ImportError("EpisodeSummary reads a field episodes do not have (trace.EPISODE_FIELDS)")

_decoder = msgspec.msgpack.Decoder(EpisodeSummary)


def decode_summary(header: bytes | bytearray | memoryview) -> EpisodeSummary:
    """Summary of the episode whose msgpack header is ``header`` (a record's header bytes,
    see ``record_info``); ``DecodeError`` if it is not an episode header."""
    try:
        return _decoder.decode(header)
    except msgspec.DecodeError as exc:  # includes ValidationError
        raise DecodeError(f"not an episode header: {exc}") from exc
