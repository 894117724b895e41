"""One-shot assembly of a trace's training samples."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..trace import Trace
from ._builder import SampleBuilder
from ._hooks import Picker, Postprocess, default_picker, default_postprocess
from ._sample import Sample

__all__ = ["assemble"]


def assemble(
    trace: Trace,
    *,
    max_seq_len: int | None = None,
    picker: Picker | None = default_picker,
    postprocess: Postprocess | None = default_postprocess,
    metadata: Mapping[str, Any] | None = None,
    computed: Mapping[str, Any] | None = None,
    overrides: Mapping[str, Any] | None = None,
    group_id: str | None = None,
    group_index: int = 0,
) -> list[Sample]:
    """Training samples of ``trace``: one per leaf the picker keeps, each its branch's model
    turns truncated to ``max_seq_len`` then merged. Metadata precedence: ``metadata``
    (request) < ``computed`` and per-sample server values < ``overrides`` (collect call).
    With nothing to train on, one aborted sample carrying ``empty_reason``."""
    return SampleBuilder(trace).samples(
        max_seq_len=max_seq_len,
        picker=picker,
        postprocess=postprocess,
        metadata=metadata,
        computed=computed,
        overrides=overrides,
        group_id=group_id,
        group_index=group_index,
    )
