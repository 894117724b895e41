"""An episode's own fields are declared once (trace.EPISODE_FIELDS) and derived elsewhere."""

from __future__ import annotations

import msgspec

from tracewire.codec import EpisodeHead, EpisodeHeader, EpisodeSummary
from tracewire.trace import EPISODE_FIELDS, Episode


def test_every_episode_shape_derives_from_the_one_declaration() -> None:
    assert set(Episode.__slots__) == {*EPISODE_FIELDS, "traces"}
    assert EpisodeHead.__struct_fields__ == EPISODE_FIELDS
    assert EpisodeHeader.__struct_fields__ == (*EPISODE_FIELDS, "schema", "traces")
    assert set(EpisodeSummary.__struct_fields__) <= {*EPISODE_FIELDS, "traces"}


def test_a_header_with_schema_right_after_id_still_decodes() -> None:
    # The order older builds wrote: fields are keyed by name, so order does not matter.
    raw = msgspec.msgpack.encode({"type": "episode", "id": "e", "schema": 1, "env": "x",
                                  "traces": []})
    h = msgspec.msgpack.decode(raw, type=EpisodeHeader)
    assert (h.id, h.schema, h.env, h.traces) == ("e", 1, "x", [])
