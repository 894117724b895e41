"""The training sample: one merged, possibly truncated branch of a trace as three arrays.

Layout (the same in memory and in the payload): ``tokens``, ``loss_mask`` and ``logprobs``
all cover the WHOLE sequence (prompt + response) and have the same length. The response
region starts at ``prompt_len`` (the first turn's prompt); ``response_mask`` and
``response_logprobs`` are its views. In the prompt region and on every token the model did
not sample (tool results, user turns between model turns) the mask is 0 and the logprob 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "ABORTED",
    "COMPLETED",
    "EMPTY_REASONS",
    "TRUNCATED",
    "Sample",
    "SampleStatus",
    "status_of",
]


class SampleStatus(StrEnum):
    """How a sample's rollout ended: ``completed``, ``truncated`` (a length limit) or
    ``aborted`` (an error, a failed call after it, or no usable tokens)."""

    COMPLETED = "completed"
    TRUNCATED = "truncated"
    ABORTED = "aborted"


COMPLETED = SampleStatus.COMPLETED
TRUNCATED = SampleStatus.TRUNCATED
ABORTED = SampleStatus.ABORTED

#: Why a result holds no sample: no model turns at all, every kept branch truncated away,
#: no turn carried token ids, the picker/postprocessor kept nothing.
EMPTY_REASONS = ("no_records", "all_truncated", "no_tokens", "none_picked")

# Finish reasons across OpenAI chat/Responses, Anthropic messages and vLLM/SGLang.
_COMPLETED_REASONS = frozenset(
    {"stop", "tool_calls", "function_call", "end_turn", "tool_use", "stop_sequence", "completed"}
)
_TRUNCATED_REASONS = frozenset(
    {"length", "max_tokens", "max_output_tokens", "model_context_window_exceeded"}
)


def status_of(finish_reason: str | None, error: str | None = None) -> SampleStatus:
    """Sample status of one model turn: ``stop``/``tool_calls`` (and their Anthropic and
    Responses spellings) → completed, ``length`` → truncated, anything else → aborted."""
    if error is not None:
        return ABORTED
    if finish_reason in _COMPLETED_REASONS:
        return COMPLETED
    if finish_reason in _TRUNCATED_REASONS:
        return TRUNCATED
    return ABORTED


def _readonly(arr: NDArray[Any]) -> NDArray[Any]:
    # A fresh view we can lock without touching the trace's own arrays.
    view = arr.view()
    view.flags.writeable = False
    return view


@dataclass(slots=True, eq=False)
class Sample:
    """One training sample: whole-sequence ``tokens`` (int32), ``loss_mask`` (uint8) and
    ``logprobs`` (float32, or None when the upstream gave none), plus identity and status."""

    tokens: NDArray[np.int32]
    loss_mask: NDArray[np.uint8]
    logprobs: NDArray[np.float32] | None
    status: SampleStatus = COMPLETED
    prompt_len: int = 0
    leaf: int = -1
    trace_id: str = ""
    group_id: str | None = None
    group_index: int = 0
    finish_reason: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    #: One ``(node, start, end)`` per merged model turn: the completion's positions.
    spans: list[tuple[int, int, int]] = field(default_factory=list)
    empty_reason: str | None = None

    @property
    def response_len(self) -> int:
        """Number of tokens from ``prompt_len`` to the end."""
        return int(self.tokens.shape[0]) - self.prompt_len

    @property
    def response_mask(self) -> NDArray[np.uint8]:
        """Loss mask of the response region (a view)."""
        return self.loss_mask[self.prompt_len :]

    @property
    def response_logprobs(self) -> NDArray[np.float32] | None:
        """Logprobs of the response region (a view), None when logprobs are null."""
        return None if self.logprobs is None else self.logprobs[self.prompt_len :]

    @property
    def nulls(self) -> list[str]:
        """Names of the fields that are null for this sample."""
        return ["logprobs"] if self.logprobs is None else []

    @classmethod
    def empty(cls, reason: str, **kwargs: Any) -> Sample:
        """The single aborted result standing for "nothing to train on" and why."""
        return cls(
            tokens=_readonly(np.zeros(0, np.int32)),
            loss_mask=_readonly(np.zeros(0, np.uint8)),
            logprobs=_readonly(np.zeros(0, np.float32)),
            status=ABORTED,
            empty_reason=reason,
            **kwargs,
        )

    def __repr__(self) -> str:
        return (
            f"Sample(len={self.tokens.shape[0]}, prompt_len={self.prompt_len}, "
            f"status={self.status!r}, leaf={self.leaf}, turns={len(self.spans)}"
            + (f", empty_reason={self.empty_reason!r}" if self.empty_reason else "")
            + ")"
        )

    def equals(self, other: Sample) -> bool:
        """Field-by-field equality with exact array comparison (NaN-free arrays)."""
        if (self.logprobs is None) != (other.logprobs is None):
            return False
        if (
            self.logprobs is not None
            and other.logprobs is not None
            and not np.array_equal(self.logprobs, other.logprobs)
        ):
            return False
        return (
            np.array_equal(self.tokens, other.tokens)
            and np.array_equal(self.loss_mask, other.loss_mask)
            and self.tokens.dtype == other.tokens.dtype
            and self.loss_mask.dtype == other.loss_mask.dtype
            and self.status == other.status
            and self.prompt_len == other.prompt_len
            and self.leaf == other.leaf
            and self.trace_id == other.trace_id
            and self.group_id == other.group_id
            and self.group_index == other.group_index
            and self.finish_reason == other.finish_reason
            and self.metadata == other.metadata
            and [tuple(s) for s in self.spans] == [tuple(s) for s in other.spans]
            and self.empty_reason == other.empty_reason
        )
