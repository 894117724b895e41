"""Tool schemas derived from signatures and docstrings."""

from __future__ import annotations

import json
from importlib import resources
from typing import Literal

from tracewire.env import tool_schema
from tracewire.env.bundled.tools import calculator, convert_units


def test_bundled_tools_derive_the_trained_schemas() -> None:
    want = json.loads(
        (resources.files("tracewire.env.bundled") / "data" / "tool_schemas.json").read_text("utf-8")
    )
    got = [tool_schema(calculator), tool_schema(convert_units)]
    # Key order matters too: the model sees these as JSON lines.
    assert json.dumps(got) == json.dumps(want)


def test_schema_types_defaults_and_docs() -> None:
    def search(query: str, limit: int = 5, tags: list[str] | None = None,
               mode: Literal["fast", "exact"] = "fast", scale: float = 1.0) -> str:
        """Search the notes.

        More text that is not the summary.

        Args:
            query: what to look for,
                over several lines
            limit: most results
        """
        return query

    fn = tool_schema(search)["function"]
    assert fn["name"] == "search" and fn["description"] == "Search the notes."
    props = fn["parameters"]["properties"]
    assert props["query"] == {"type": "string",
                              "description": "what to look for, over several lines"}
    assert props["limit"] == {"type": "integer", "description": "most results", "default": 5}
    assert props["tags"] == {"anyOf": [{"type": "array", "items": {"type": "string"}},
                                       {"type": "null"}], "default": None}
    assert props["mode"] == {"type": "string", "enum": ["fast", "exact"], "default": "fast"}
    assert props["scale"] == {"type": "number", "default": 1.0}
    assert fn["parameters"]["required"] == ["query"]
