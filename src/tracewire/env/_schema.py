"""JSON schemas for tools derived from Python signatures and docstrings.

The first docstring paragraph is the tool's description; parameter descriptions come from
a Google-style ``Args:`` section (``name: text``, continuation lines indented) or Sphinx
``:param name: text`` lines. Annotations map to JSON schema types; parameters without a
default are required.
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Union

__all__ = ["tool_schema"]

_SIMPLE: dict[Any, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    type(None): "null",
}


def _type_schema(tp: Any) -> dict[str, Any]:
    if tp is inspect.Parameter.empty or tp is Any:
        return {}
    if tp in _SIMPLE:
        return {"type": _SIMPLE[tp]}
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is Literal:
        values = list(args)
        kinds = {_SIMPLE.get(type(v)) for v in values}
        out: dict[str, Any] = {}
        if len(kinds) == 1 and None not in kinds:
            out["type"] = kinds.pop()
        out["enum"] = values
        return out
    if origin in (Union, types.UnionType):
        subs = [_type_schema(a) for a in args]
        if all(set(s) == {"type"} for s in subs):
            return {"type": [s["type"] for s in subs]}
        return {"anyOf": subs}
    if origin in (list, Sequence, tuple, set, frozenset) or tp in (list, tuple, set):
        item = _type_schema(args[0]) if args and args[0] is not Ellipsis else {}
        return {"type": "array", "items": item} if item else {"type": "array"}
    if origin in (dict, Mapping) or tp is dict:
        return {"type": "object"}
    return {}


def _doc_parts(doc: str) -> tuple[str, dict[str, str]]:
    doc = inspect.cleandoc(doc)
    paragraphs = re.split(r"\n\s*\n", doc, maxsplit=1)
    summary = " ".join(paragraphs[0].split()) if paragraphs[0] else ""
    if summary.lower().startswith(("args:", "arguments:", "parameters:", ":param")):
        summary = ""
    params: dict[str, str] = {}
    for m in re.finditer(r"^:param\s+(?:\w+\s+)?(\w+):\s*(.*)$", doc, re.M):
        params[m.group(1)] = m.group(2).strip()
    section = re.search(r"^(?:Args|Arguments|Parameters):\s*\n((?:[ \t]+.*\n?|\s*\n)*)", doc, re.M)
    if section:
        current: str | None = None
        for line in section.group(1).splitlines():
            pm = re.match(r"^\s+(\w+)(?:\s*\([^)]*\))?:\s*(.*)$", line)
            if pm and (current is None or _indent(line) <= _indent_of_first(section.group(1))):
                current = pm.group(1)
                params[current] = pm.group(2).strip()
            elif current is not None and line.strip():
                params[current] = f"{params[current]} {line.strip()}".strip()
    return summary, params


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _indent_of_first(block: str) -> int:
    for line in block.splitlines():
        if line.strip():
            return _indent(line)
    return 0


def tool_schema(fn: Callable[..., Any]) -> dict[str, Any]:
    """The OpenAI ``{"type": "function", "function": {...}}`` entry describing ``fn``."""
    name = getattr(fn, "__name__", None)
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"tool {fn!r} needs a function name")
    sig = inspect.signature(fn)
    try:
        hints = typing.get_type_hints(fn)
    except Exception:
        hints = {}
    summary, docs = _doc_parts(inspect.getdoc(fn) or "")
    props: dict[str, Any] = {}
    required: list[str] = []
    for pname, param in sig.parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        schema = _type_schema(hints.get(pname, param.annotation))
        if pname in docs:
            schema["description"] = docs[pname]
        if param.default is param.empty:
            required.append(pname)
        elif param.default is None or isinstance(param.default, str | int | float | bool):
            schema["default"] = param.default
        props[pname] = schema
    parameters: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        parameters["required"] = required
    function: dict[str, Any] = {"name": name}
    if summary:
        function["description"] = summary
    function["parameters"] = parameters
    return {"type": "function", "function": function}
