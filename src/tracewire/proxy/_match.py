"""The match step of a turn: find the request's messages in the session's message graph
(known ones by the hash of their raw bytes, the rest decoded and digested), and the
matched history an upstream that renders prompts itself is handed."""

from __future__ import annotations

from ._http import BadRequest
from ._request import HarnessRequest
from ._session import Session
from ._turn_types import Prepared
from ._upstream_api import TurnContext

__all__ = ["context", "match"]


def match(session: Session, up: HarnessRequest) -> Prepared:
    """The deepest node the request's messages match and the messages past it.
    ``BadRequest`` when a new message is malformed."""
    g = session.graph
    parent, k = g.match_fast(up.raws, up.base) if up.raws is not None else (None, 0)
    try:
        rest = up.new_messages(k)
    except (ValueError, TypeError) as exc:
        raise BadRequest(400, f"bad message: {exc}") from exc
    parent, new = g.match_rest(parent, rest)
    return Prepared(parent, new)


def context(session: Session, prep: Prepared) -> TurnContext:
    """The matched history for an upstream that renders prompts itself."""
    trace = session.trace
    parent = prep.parent
    ids = None
    sampled, by_stop = False, True
    if parent is not None:
        _, ok, path = session.graph.path_ids(parent)
        ids = path.copy() if ok and path is not None else None
        sampled = trace.nodes[parent].sampled
        if sampled:
            for c in reversed(trace.calls):  # the matching call is almost always last
                if c.node == parent:
                    by_stop = c.finish_reason != "length"
                    break
    root = trace.nodes[0].message.role if trace.nodes else None
    return TurnContext(session.id, len(prep.new), ids, sampled, by_stop, bool(trace.nodes),
                       root)
