"""The well-known ``info`` keys are spelled once, in ``trace.InfoKey``: a module that reads or
writes ``x.info[...]`` with one of their values as a literal fails here (a misspelled
literal would otherwise be a silently missing figure)."""

from __future__ import annotations

import ast
from pathlib import Path

import tracewire
from tracewire.trace import InfoKey

SRC = Path(tracewire.__file__).parent
KNOWN = {v for k, v in vars(InfoKey).items() if k.isupper() and isinstance(v, str)}


def _info_key_literals(tree: ast.AST) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []

    def is_info(node: ast.AST) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "info"

    for node in ast.walk(tree):
        key: ast.AST | None = None
        if isinstance(node, ast.Subscript) and is_info(node.value):
            key = node.slice
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("get", "pop", "setdefault") and is_info(node.func.value)
              and node.args):
            key = node.args[0]
        elif isinstance(node, ast.Dict) and any(
                k is None and is_info(v) for k, v in zip(node.keys, node.values, strict=True)):
            for k in node.keys:
                if isinstance(k, ast.Constant) and k.value in KNOWN:
                    found.append((node.lineno, k.value))
        if isinstance(key, ast.Constant) and key.value in KNOWN:
            found.append((node.lineno, key.value))
    return found


def test_known_keys_are_the_ones_the_parts_share() -> None:
    assert {"tito_mismatch", "tito", "token_mismatches", "history_rewrites", "incomplete",
            "step", "policy_version"} == KNOWN


def test_no_module_spells_a_known_info_key() -> None:
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        offenders += [f"{path.relative_to(SRC)}:{line}: {key!r}"
                      for line, key in _info_key_literals(tree)]
    assert offenders == [], "use trace.InfoKey for these: " + ", ".join(offenders)


def test_the_check_sees_each_way_of_spelling_a_key() -> None:
    # The scan itself: each form it claims to catch is caught (and a harness's own key is not).
    code = ('t.info["tito_mismatch"] = 1\nt.info.get("step")\n'
            'e.info = {**e.info, "incomplete": True}\nt.info["solved_in"] = 3\n')
    assert sorted(k for _, k in _info_key_literals(ast.parse(code))) == [
        "incomplete", "step", "tito_mismatch"]
