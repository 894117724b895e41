"""Branch: the tokens of one root-to-leaf path, as zero-copy views when contiguous."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from ._columns import Columns
from ._model import Node

__all__ = ["Branch", "NodesAndColumns"]


class NodesAndColumns(Protocol):
    """What a branch reads of its trace (a protocol, so this module needs no ``Trace``)."""

    @property
    def nodes(self) -> Sequence[Node]: ...

    @property
    def columns(self) -> Columns: ...


class Branch:
    """Root-to-leaf path of a trace. Column reads are views if the path's slices are adjacent
    (every linear conversation), otherwise concatenations of the node slices."""

    __slots__ = ("_spans", "nodes", "trace")

    def __init__(self, trace: NodesAndColumns, nodes: list[int]) -> None:
        self.trace = trace
        #: Node indices from root to leaf.
        self.nodes = nodes
        # Merge adjacent node slices so a linear conversation becomes a single span.
        spans: list[tuple[int, int]] = []
        for i in nodes:
            n = trace.nodes[i]
            if n.start == n.end:
                continue
            if spans and spans[-1][1] == n.start:
                spans[-1] = (spans[-1][0], n.end)
            else:
                spans.append((n.start, n.end))
        self._spans = spans

    @property
    def leaf(self) -> int:
        """Index of the last node on the path (-1 for an empty branch)."""
        return self.nodes[-1] if self.nodes else -1

    @property
    def contiguous(self) -> bool:
        """True when all the path's tokens form one slice of the columns."""
        return len(self._spans) <= 1

    def __len__(self) -> int:
        return sum(e - s for s, e in self._spans)

    def column(self, name: str) -> NDArray[Any]:
        """Column ``name`` along the path (a view when contiguous)."""
        col = self.trace.columns.column(name)
        if not self._spans:
            return col[0:0]
        if len(self._spans) == 1:
            s, e = self._spans[0]
            return col[s:e]
        return np.concatenate([col[s:e] for s, e in self._spans])

    @property
    def ids(self) -> NDArray[np.int32]:
        """Token ids along the path."""
        return self.column("ids")

    @property
    def mask(self) -> NDArray[np.uint8]:
        """Loss mask along the path."""
        return self.column("mask")

    @property
    def logprobs(self) -> NDArray[np.float32]:
        """Logprobs along the path (NaN where not sampled)."""
        return self.column("logprobs")
