"""An episode's index row, from the live object or from its record's msgpack header.

The header path uses the codec's light decoder (``tracewire.codec.decode_summary``), which
skips nodes and token buffers, so indexing bytes received over the wire (or rebuilding rows
during recovery) never decodes or re-encodes the columns. Both paths give the same row.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..codec import TraceSummary, decode_summary
from ..trace import InfoKey
from ._schema import IndexRow, RecordRef
from ._status import EpisodeStatus

__all__ = ["row_from_episode", "row_from_header"]


def _usage(u: dict[str, int], *keys: str) -> int:
    for k in keys:
        v = u.get(k)
        if v is not None:
            return int(v)
    return 0


def _int_info(info: dict[str, Any], key: str) -> int | None:
    # Trainer bookkeeping is set by user code: anything but a plain int reads as absent.
    v = info.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) and -(2**63) <= v < 2**63 else None


def row_from_episode(
    ep: Any, ref: RecordRef, written: float, pause: Callable[[], None] | None = None
) -> IndexRow:
    """Index row of a live :class:`~tracewire.Episode` (plain Python, with ``pause()`` every
    128 calls so the writer thread lets the event loop in during long episodes)."""
    return _row(ep, ref, written, n_tokens=lambda t: len(t.columns), pause=pause)


def row_from_header(
    header: bytes | bytearray | memoryview, ref: RecordRef, written: float
) -> IndexRow:
    """Index row of the episode whose msgpack header is ``header`` (skips nodes/buffers)."""
    return _row(decode_summary(header), ref, written, n_tokens=_header_tokens)


def _header_tokens(t: TraceSummary) -> int:
    return t.n_tokens


def _row(
    e: Any, ref: RecordRef, written: float, n_tokens: Any, pause: Callable[[], None] | None = None
) -> IndexRow:
    started: float | None = None
    ended: float | None = None

    def see(span: Any) -> None:
        nonlocal started, ended
        if started is None or span.start < started:
            started = span.start
        if span.end is not None and (ended is None or span.end > ended):
            ended = span.end

    for span in e.timing.values():
        see(span)
    turns = inp = out = n_tok = errors = 0
    for t in e.traces:
        for span in t.timing.values():
            see(span)
        turns += len(t.calls)
        errors += len(t.errors)
        for k, c in enumerate(t.calls):
            # ~3 µs per call: pause every 128 so the writer never holds the GIL long.
            if pause is not None and k and not k & 127:
                pause()
            if c.span is not None:
                see(c.span)
            inp += _usage(c.usage, "prompt_tokens", "input_tokens")
            out += _usage(c.usage, "completion_tokens", "output_tokens")
        n_tok += n_tokens(t)
    main = e.traces[0] if e.traces else TraceSummary()
    return IndexRow(
        episode_id=e.id,
        run=e.run,
        env=e.env,
        task_key=e.task_key,
        group_id=e.group_id,
        group_index=e.group_index,
        status=(EpisodeStatus.INCOMPLETE if e.info.get(InfoKey.INCOMPLETE)
                else EpisodeStatus.COMPLETE).value,
        ok=e.ok,
        stop=main.stop,
        reward=float(sum(r.score * r.weight for r in main.rewards.values())),
        rewards={k: r.score for k, r in main.rewards.items()},
        metrics=dict(main.metrics),
        turns=turns,
        input_tokens=inp,
        output_tokens=out,
        n_tokens=n_tok,
        n_traces=len(e.traces),
        errors=errors + len(e.errors),
        started=started,
        ended=ended,
        duration=None if started is None or ended is None else ended - started,
        written=written,
        segment=ref.segment,
        offset=ref.offset,
        length=ref.length,
        crc=ref.crc,
        step=_int_info(e.info, InfoKey.STEP),
        policy_version=_int_info(e.info, InfoKey.POLICY_VERSION),
        tito_mismatch=_int_info(e.info, InfoKey.TITO_MISMATCH),
    )

